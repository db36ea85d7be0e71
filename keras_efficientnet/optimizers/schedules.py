"""Learning-rate schedules: linear warm-up, then staircase exponential, cosine, polynomial, flat."""

from __future__ import annotations

import math

import keras
from keras import ops

DECAY_TYPES = ("constant", "exponential", "cosine", "polynomial")


def scaled_learning_rate(base_per_sample: float, global_batch: int) -> float:
    """Returns the linear-scaling-rule rate `base_per_sample * global_batch`.

    The recipes state rates per sample: RMSProp 2^-14 x 768 = 0.046875, LARS 2^-9.5 x 6144.

    Args:
        base_per_sample: Learning rate per example in the global batch, > 0.
        global_batch: Examples per optimizer step over all replicas and accumulation, > 0.
    """
    if not base_per_sample > 0:
        raise ValueError(
            f"`base_per_sample` must be > 0. Received: base_per_sample={base_per_sample}"
        )
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch <= 0:
        raise ValueError(
            f"`global_batch` must be a positive int. Received: global_batch={global_batch!r}"
        )
    return float(base_per_sample) * global_batch


def _check_decay(decay, warmup_steps, total_steps, decay_steps, decay_rate,
                 decay_from_start) -> None:
    """The arguments each decay needs, checked (a ValueError naming the argument)."""
    if decay not in DECAY_TYPES:
        raise ValueError(f"`decay` must be one of {DECAY_TYPES}. Received: {decay=!r}")
    if decay == "exponential":
        if decay_steps is None or not decay_steps > 0:
            raise ValueError(
                f'decay="exponential" needs `decay_steps` > 0. Received: {decay_steps=}'
            )
        if decay_rate is None or not 0 < decay_rate <= 1:
            raise ValueError(
                f'decay="exponential" needs `decay_rate` in (0, 1]. Received: {decay_rate=}'
            )
    if decay in ("cosine", "polynomial"):
        # Counted from step 0, the decay needs only a length; after warm-up, a length past it.
        floor = 0 if decay_from_start else warmup_steps
        if total_steps is None or not total_steps > floor:
            raise ValueError(
                f"decay={decay!r} needs `total_steps` > "
                f"{'0' if decay_from_start else '`warmup_steps`'}. "
                f"Received: {total_steps=}, {warmup_steps=}"
            )


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `base_learning_rate`, then a decay that starts where warm-up ends.

    With `t = step - warmup_steps` and `T = total_steps - warmup_steps`:

    - warm-up (`step < warmup_steps`): `start + (base - start) * step / warmup_steps`, so step 0
      uses `warmup_start_learning_rate` and step `warmup_steps` the full base rate.
    - "constant": `base`.
    - "exponential": `base * decay_rate ** floor(t / decay_steps)` (staircase), or without the
      floor when `staircase=False`. `decay_steps` may be fractional (e.g. 2.4 epochs of steps).
    - "cosine": `end + (base - end) * (1 + cos(pi * t / T)) / 2`, then `end` after `total_steps`.
    - "polynomial": `end + (base - end) * (1 - t / T) ** power`, then `end` after `total_steps`.

    With `decay_from_start=True` the decay counts from step 0 instead, warm-up included
    (`t = step`, `T = total_steps`), and warm-up ramps towards the decayed rate:
    `start + (decayed(step) - start) * step / warmup_steps`. This is how Graphcore's exponential
    and cosine schedules run; `warmup_steps` may then exceed `total_steps` (their 2-epoch
    fine-tune under a 5-epoch warm-up rises and falls without reaching the base rate).

    The paper's RMSProp recipe is 5 warm-up epochs and x0.97 every 350/146 epochs counted from
    step 0 ("exponential", `decay_from_start=True`); the LARS recipe is 70 warm-up epochs then
    power 2 to 1e-5 x base ("polynomial"), the MLPerf shape (Goyal et al., 2017 warm-up; You et
    al., 2017 polynomial decay).

    Args:
        base_learning_rate: Peak rate, reached at the end of warm-up, > 0.
        warmup_steps: Length of the linear warm-up in optimizer steps, >= 0. Defaults to 0.
        decay: One of "constant", "exponential", "cosine", "polynomial". Defaults to "constant".
        total_steps: Training length in steps; required for "cosine" and "polynomial" and must
            exceed `warmup_steps`. Defaults to None.
        decay_steps: Steps per decay period for "exponential", > 0. Defaults to None.
        decay_rate: Factor per period for "exponential", in (0, 1]. Defaults to None.
        staircase: Decay in whole periods for "exponential". Defaults to True.
        end_learning_rate: Final rate for "cosine" and "polynomial", >= 0. Defaults to 0.0.
        power: Exponent for "polynomial", > 0. Defaults to 1.0.
        warmup_start_learning_rate: Rate at step 0, >= 0. Defaults to 0.0.
        decay_from_start: Count the decay from step 0, not from the end of warm-up. Defaults
            to False.
        name: Optional name. Defaults to None.

    Example:

        lr = scaled_learning_rate(2**-14, 768)
        schedule = WarmupSchedule(lr, 5 * steps_per_epoch, "exponential",
                                  decay_steps=2.4 * steps_per_epoch, decay_rate=0.97)
    """

    def __init__(
        self,
        base_learning_rate: float,
        warmup_steps: int = 0,
        decay: str = "constant",
        total_steps: int | None = None,
        decay_steps: float | None = None,
        decay_rate: float | None = None,
        staircase: bool = True,
        end_learning_rate: float = 0.0,
        power: float = 1.0,
        warmup_start_learning_rate: float = 0.0,
        decay_from_start: bool = False,
        name: str | None = None,
    ):
        super().__init__()
        if not base_learning_rate > 0:
            raise ValueError(f"`base_learning_rate` must be > 0. Received: {base_learning_rate=}")
        if warmup_steps < 0:
            raise ValueError(f"`warmup_steps` must be >= 0. Received: {warmup_steps=}")
        _check_decay(decay, warmup_steps, total_steps, decay_steps, decay_rate, decay_from_start)
        if end_learning_rate < 0:
            raise ValueError(f"`end_learning_rate` must be >= 0. Received: {end_learning_rate=}")
        if not power > 0:
            raise ValueError(f"`power` must be > 0. Received: {power=}")
        if warmup_start_learning_rate < 0:
            raise ValueError(
                "`warmup_start_learning_rate` must be >= 0. "
                f"Received: {warmup_start_learning_rate=}"
            )
        self.base_learning_rate = base_learning_rate
        self.warmup_steps = warmup_steps
        self.decay = decay
        self.total_steps = total_steps
        self.decay_steps = decay_steps
        self.decay_rate = decay_rate
        self.staircase = staircase
        self.end_learning_rate = end_learning_rate
        self.power = power
        self.warmup_start_learning_rate = warmup_start_learning_rate
        self.decay_from_start = bool(decay_from_start)
        self.name = name

    def _decayed(self, t):
        """The decayed rate `t` steps into the decay (t >= 0, float32)."""
        base = self.base_learning_rate
        if self.decay == "constant":
            return ops.full_like(t, base)
        if self.decay == "exponential":
            periods = t / self.decay_steps
            if self.staircase:
                periods = ops.floor(periods)
            return base * ops.power(ops.cast(self.decay_rate, "float32"), periods)
        length = self.total_steps - (0 if self.decay_from_start else self.warmup_steps)
        fraction = ops.minimum(t / float(length), 1.0)
        end = self.end_learning_rate
        if self.decay == "cosine":
            return end + (base - end) * 0.5 * (1.0 + ops.cos(math.pi * fraction))
        return end + (base - end) * ops.power(1.0 - fraction, self.power)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        if self.decay_from_start:
            decayed = self._decayed(ops.maximum(step, 0.0))
            target = decayed
        else:
            # Clamped so that the decay branch, computed for every step, stays in its domain.
            decayed = self._decayed(ops.maximum(step - self.warmup_steps, 0.0))
            target = self.base_learning_rate
        if self.warmup_steps == 0:
            return decayed
        start = self.warmup_start_learning_rate
        warmup = start + (target - start) * step / float(self.warmup_steps)
        return ops.where(step < self.warmup_steps, warmup, decayed)

    def get_config(self) -> dict:
        return {
            "base_learning_rate": self.base_learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "total_steps": self.total_steps,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "staircase": self.staircase,
            "end_learning_rate": self.end_learning_rate,
            "power": self.power,
            "warmup_start_learning_rate": self.warmup_start_learning_rate,
            "decay_from_start": self.decay_from_start,
            "name": self.name,
        }
