"""LARS (layer-wise adaptive rate scaling) in the MLPerf-compliant form, for Keras 3."""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import ops

from keras_efficientnet.optimizers import weight_decay as wd_lib


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class LARS(keras.optimizers.Optimizer):
    """Momentum SGD whose per-variable step is scaled by a trust ratio, as in MLPerf ResNet-50.

    For each variable `w` with gradient `g` that no regex in `exclude` matches:

        trust = eta * ||w|| / (||g|| + weight_decay_l2 * ||w|| + epsilon)   (1 if a norm is 0)
        v     <- momentum * v + lr * trust * (g + weight_decay_l2 * w)
        w     <- w - v

    Excluded variables take a plain momentum SGD step, `v <- momentum * v + lr * g`, with the
    global learning rate and no weight decay.

    Implements LARS (You, Gitman & Ginsburg, 2017, arXiv 1708.03888) in the form of the MLPerf
    Training reference, as used for Graphcore's large-batch G16-B4 (Masters et al., 2021). Where
    it departs from the paper:

    - The learning rate is applied *inside* the momentum accumulator (`v` holds a step, not a
      velocity of gradients), so a schedule change reaches the weights gradually.
    - An `epsilon` is added to the trust-ratio denominator (0 by default, as MLPerf fixes), and
      the ratio falls back to 1 when `||w||` or `||g||` is 0 (e.g. zero-initialised kernels)
      instead of dividing by zero or freezing the variable.
    - Weight decay is L2 added to the gradient *and* counted in the trust-ratio denominator,
      rather than decoupled.
    - Variables are left out of both the trust ratio and the weight decay by regex on their
      path (`exclude`; by default norm / proxy-norm `gamma` and `beta`, and all biases), where the
      paper applies LARS to every layer. The norms are per variable (a kernel and its bias are
      separate "layers"), not per Keras layer.

    Args:
        learning_rate: Float or `keras.optimizers.schedules.LearningRateSchedule`. The B4 recipe
            uses 2^-9.5 x 6144 = 8.485 with warm-up and polynomial decay. Defaults to 0.1.
        momentum: Momentum coefficient in [0, 1). Defaults to 0.9 (the B4 recipe uses 0.885).
        eta: Trust coefficient, > 0. Defaults to 0.001.
        epsilon: Added to the trust-ratio denominator, >= 0. Defaults to 0.0.
        weight_decay_l2: Weight decay inside LARS, >= 0. Defaults to 0.0 (the B4 recipe uses
            2.5e-6).
        exclude: Regexes matched with `re.search` against each variable's path
            ("predictions/bias"); matching variables skip the trust ratio and the weight decay.
            Defaults to `DEFAULT_LARS_EXCLUDE` (whole-component `gamma`, `beta` and `bias`).
        **kwargs: Forwarded to `keras.optimizers.Optimizer` (`name`, `clipnorm`, `use_ema`, ...).
            Keras' own `weight_decay` is rejected; use `weight_decay_l2`.

    Example:

        opt = LARS(learning_rate=schedule, momentum=0.885, weight_decay_l2=2.5e-6)
        model.compile(optimizer=opt, loss="categorical_crossentropy")
        model.fit(dataset, epochs=350)
    """

    def __init__(
        self,
        learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 0.1,
        momentum: float = 0.9,
        eta: float = 0.001,
        epsilon: float = 0.0,
        weight_decay_l2: float = 0.0,
        exclude: Sequence[str] = wd_lib.DEFAULT_LARS_EXCLUDE,
        **kwargs,
    ):
        wd_lib.reject_keras_weight_decay(kwargs, type(self).__name__)
        super().__init__(learning_rate=learning_rate, **kwargs)
        wd_lib.check_momentum_and_decay(momentum, weight_decay_l2)
        if eta <= 0.0:
            raise ValueError(f"`eta` must be > 0. Received: eta={eta}")
        if epsilon < 0.0:
            raise ValueError(f"`epsilon` must be >= 0. Received: epsilon={epsilon}")
        self.momentum = momentum
        self.eta = eta
        self.epsilon = epsilon
        self.weight_decay_l2 = weight_decay_l2
        self.exclude = wd_lib.validate_patterns(exclude, "exclude")

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums = self.add_optimizer_variables(var_list, "momentum")
        self._excluded = wd_lib.excluded_mask(var_list, self.exclude)

    def _trust_ratio(self, gradient, variable):
        """eta * ||w|| / (||g|| + wd * ||w|| + eps), or 1 where either norm is 0."""
        w_norm = ops.sqrt(ops.sum(ops.square(variable)))
        g_norm = ops.sqrt(ops.sum(ops.square(gradient)))
        both_positive = ops.logical_and(ops.greater(w_norm, 0.0), ops.greater(g_norm, 0.0))
        denominator = g_norm + self.weight_decay_l2 * w_norm + self.epsilon
        # Keep the unused branch finite: with epsilon = 0 and ||g|| = 0 it would be 0 / 0.
        denominator = ops.where(both_positive, denominator, ops.ones_like(denominator))
        return ops.where(both_positive, self.eta * w_norm / denominator, ops.ones_like(denominator))

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        if self._excluded[index]:
            step = ops.multiply(lr, gradient)
        else:
            if self.weight_decay_l2 > 0.0:
                decayed = ops.add(gradient, ops.multiply(self.weight_decay_l2, variable))
            else:
                decayed = gradient
            trust = self._trust_ratio(gradient, variable)
            step = ops.multiply(ops.multiply(lr, trust), decayed)

        momentum = self._momentums[index]
        self.assign(momentum, ops.add(ops.multiply(self.momentum, momentum), step))
        self.assign_sub(variable, momentum)

    def get_config(self) -> dict:
        config = super().get_config()
        # Keras' decoupled decay is not a constructor argument here (see `weight_decay_l2`).
        config.pop("weight_decay", None)
        config.update(
            {
                "momentum": self.momentum,
                "eta": self.eta,
                "epsilon": self.epsilon,
                "weight_decay_l2": self.weight_decay_l2,
                "exclude": list(self.exclude),
            }
        )
        return config
