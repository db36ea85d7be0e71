"""The optimizer's per-variable state (its slots) carried from training into the fine-tune.

Graphcore's weight averaging (`weight_avg.py`) averages every variable of the per-epoch
checkpoints, the optimizer's slots included, and its fine-tune restores that averaged checkpoint
with a plain saver: the head's RMSProp mean squares and momenta start from their averaged values
rather than from the optimizer's initial state (mean square 1, momentum 0). Here
`SlotAverage` keeps the average of the slots beside the weights' (appended to the weight
average's arrays, so a checkpoint's `average.npz` holds them too) and `restore_slots` puts the
head's into the fine-tune's optimizer.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_efficientnet.training.callbacks import WeightAverage
from keras_efficientnet.training.checkpoint import to_numpy

# The optimizers' slot lists, each parallel to the variables the optimizer was built for:
# RMSPropTF has both, LARS and SGD momenta only.
SLOT_LISTS = ("_mean_squares", "_momentums")


def slot_owner(optimizer):
    """The optimizer that holds the slots: under mixed_float16 Keras' `compile` wraps the
    run's optimizer in a `LossScaleOptimizer`, whose own variables are the loss scale and its
    step counter; the slots are its inner optimizer's."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def slot_variables(optimizer) -> list:
    """The optimizer's slot variables (a `LossScaleOptimizer`'s inner optimizer's), kind by
    kind (mean squares, then momenta), each kind in the order of the variables it was built
    for; empty for an optimizer without these slots."""
    owner = slot_owner(optimizer)
    return [v for name in SLOT_LISTS for v in getattr(owner, name, None) or ()]


def read_slots(optimizer) -> list[np.ndarray]:
    """The slots' current values (`slot_variables` order)."""
    return [to_numpy(v) for v in slot_variables(optimizer)]


class SlotAverage(WeightAverage):
    """`WeightAverage` whose arrays go on with the optimizer's slots (`slot_variables` order),
    averaged with the same decay at each epoch's end, as Graphcore's averaging treats every
    variable of its checkpoints.

    `weights_like(model)` still gives the averaged weights (the slots' arrays come after them);
    `slots(model)` gives the averaged slots. An average saved without slots (an older checkpoint)
    starts their average from the slots of the next update.
    """

    def update(self, model) -> None:
        optimizer = getattr(model, "optimizer", None)
        current = [np.asarray(w, dtype="float64") for w in model.get_weights()]
        current += [a.astype("float64") for a in read_slots(optimizer)] if optimizer else []
        if self.values is None:
            self.values = current
            return
        values = list(self.values) + current[len(self.values):]  # slots new to the average
        self.values = [self.decay * a + (1.0 - self.decay) * c for a, c in zip(values, current)]

    def slots(self, model) -> list[np.ndarray] | None:
        """The averaged slots, or None when the average holds none."""
        slots = (self.values or [])[len(model.weights):]
        return slots or None


def restore_slots(optimizer, trained: list, slots: list[np.ndarray], tuned: list) -> int:
    """Assigns the slots of `tuned` (a subset of `trained`, e.g. the head's variables) from
    `slots`, those of the optimizer that trained `trained` (`slot_variables` order), into
    `optimizer` (a `LossScaleOptimizer`'s inner one), which is built here for `tuned` if it is
    not yet. Returns how many it assigned.

    Raises ValueError when `slots` cannot be `trained`'s for an optimizer of this kind.
    """
    if not optimizer.built:
        optimizer.build(tuned)  # a LossScaleOptimizer builds its inner one too
    optimizer = slot_owner(optimizer)
    kinds = [name for name in SLOT_LISTS if getattr(optimizer, name, None)]
    if len(slots) != len(kinds) * len(trained):
        raise ValueError(
            f"{len(slots)} saved optimizer slots do not fit {type(optimizer).__name__}'s "
            f"{len(kinds)} slot kinds ({', '.join(kinds) or 'none'}) x {len(trained)} variables; "
            "the checkpoint was trained with another optimizer or model")
    position = {id(v): i for i, v in enumerate(trained)}
    assigned = 0
    for k, name in enumerate(kinds):
        for variable, slot in zip(tuned, getattr(optimizer, name)):
            saved = slots[k * len(trained) + position[id(variable)]]
            if tuple(saved.shape) != tuple(slot.shape):
                raise ValueError(f"saved slot {name[1:]} of {variable.path} has shape "
                                 f"{saved.shape}, the variable {tuple(slot.shape)}")
            slot.assign(saved.astype(slot.dtype))
            assigned += 1
    return assigned


__all__ = ["SLOT_LISTS", "SlotAverage", "read_slots", "restore_slots", "slot_owner",
           "slot_variables"]
