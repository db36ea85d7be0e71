"""Momentum SGD with L2 weight decay that skips variables by regex on their paths, for Keras 3."""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import ops

from keras_efficientnet.optimizers import weight_decay as wd_lib


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class SGD(wd_lib.L2DecayOptimizer):
    """Heavy-ball momentum SGD with the same weight-decay semantics as `RMSPropTF`.

    For each variable `w` with gradient `g` (after L2: `g + weight_decay_l2 * w`):

        v <- momentum * v + lr * g
        w <- w - v

    This is TF1's `MomentumOptimizer` (Polyak, 1964; Sutskever et al., 2013 without Nesterov).
    It differs from `keras.optimizers.SGD` only in the weight decay: here it is L2 added to the
    gradient and skips variables whose path matches a regex in `weight_decay_exclude`, whereas
    Keras decays decoupled from the gradient and excludes by substring of the variable's name.
    Like Keras, the learning rate sits inside the momentum accumulator.

    Args:
        learning_rate: Float or `keras.optimizers.schedules.LearningRateSchedule`. Defaults to
            0.01.
        momentum: Momentum coefficient in [0, 1). Defaults to 0.9.
        weight_decay_l2: L2 coefficient added to the gradient as `weight_decay_l2 * w`. Defaults
            to 0.0.
        weight_decay_exclude: Regexes matched with `re.search` against each variable's path;
            matching variables get no weight decay. Defaults to `DEFAULT_WEIGHT_DECAY_EXCLUDE`
            (whole-component `gamma` and `beta`).
        **kwargs: Forwarded to `keras.optimizers.Optimizer` (`name`, `clipnorm`, `use_ema`, ...).
            Keras' own `weight_decay` is rejected; use `weight_decay_l2`.

    Example:

        opt = SGD(learning_rate=0.1, momentum=0.9, weight_decay_l2=5e-5)
        model.compile(optimizer=opt, loss="categorical_crossentropy")
        model.fit(dataset, epochs=2)
    """

    def __init__(
        self,
        learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 0.01,
        momentum: float = 0.9,
        weight_decay_l2: float = 0.0,
        weight_decay_exclude: Sequence[str] = wd_lib.DEFAULT_WEIGHT_DECAY_EXCLUDE,
        **kwargs,
    ):
        super().__init__(learning_rate, momentum, weight_decay_l2, weight_decay_exclude,
                         **kwargs)

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums = self.add_optimizer_variables(var_list, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = self.decayed_gradient(gradient, variable, index)
        momentum = self._momentums[index]
        self.assign(
            momentum, ops.add(ops.multiply(self.momentum, momentum), ops.multiply(lr, gradient))
        )
        self.assign_sub(variable, momentum)
