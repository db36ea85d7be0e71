"""TF1-style RMSProp (epsilon inside the square root, mean square initialised to 1) for Keras 3."""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import ops

from keras_efficientnet.optimizers import weight_decay as wd_lib


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class RMSPropTF(wd_lib.L2DecayOptimizer):
    """RMSProp with momentum in the TensorFlow 1 form used by the EfficientNet recipes.

    For each variable `w` with gradient `g` (after L2: `g + weight_decay_l2 * w`):

        ms  <- rho * ms + (1 - rho) * g^2           (ms starts at 1.0)
        mom <- momentum * mom + lr * g / sqrt(ms + epsilon)
        w   <- w - mom

    Implements RMSProp (Tieleman & Hinton, 2012, lecture 6.5) as TF1's `RMSPropOptimizer` does,
    which is what Tan & Le (2019) and Masters et al. (2021, arXiv 2106.03640) trained with. Where
    it departs from the lecture (and, for the last two points, from `keras.optimizers.RMSprop`):

    - `epsilon` is added *inside* the square root, and is large (1e-3), so it damps the steps of
      variables with small gradients rather than only guarding a division by zero.
    - Momentum is applied to the scaled step with the learning rate *inside* the accumulator, so
      a learning-rate change reaches the weights gradually.
    - The mean square starts at 1.0, not 0, so early steps are close to momentum SGD instead of
      `sign(g)`-sized jumps.
    - Weight decay is classic L2 added to the gradient (so RMSProp normalises it like the loss
      gradient), not Keras' decoupled `weight_decay`, and skips variables whose path matches any
      regex in `weight_decay_exclude` (by default norm and proxy-norm `gamma` / `beta`; a proxy
      norm's `proxy_gamma` / `proxy_beta`, which decay pulls back to N(0, 1), and all biases are
      decayed).

    Args:
        learning_rate: Float or `keras.optimizers.schedules.LearningRateSchedule`. The paper uses
            2^-14 x global batch (see `scaled_learning_rate`). Defaults to 0.001.
        rho: Decay of the mean-square accumulator. Defaults to 0.953125, the paper value.
        momentum: Momentum coefficient in [0, 1). Defaults to 0.9.
        epsilon: Added to the mean square inside the square root. Defaults to 1e-3.
        weight_decay_l2: L2 coefficient added to the gradient as `weight_decay_l2 * w`. Defaults
            to 0.0 (the paper recipe uses 1e-5).
        weight_decay_exclude: Regexes matched with `re.search` against each variable's path
            ("block1a/project_norm/gamma"); matching variables get no weight decay. Defaults to
            `DEFAULT_WEIGHT_DECAY_EXCLUDE` (whole-component `gamma` and `beta`).
        **kwargs: Forwarded to `keras.optimizers.Optimizer` (`name`, `clipnorm`, `use_ema`, ...).
            Keras' own `weight_decay` is rejected; use `weight_decay_l2`.

    Example:

        opt = RMSPropTF(learning_rate=scaled_learning_rate(2**-14, 768), weight_decay_l2=1e-5)
        model.compile(optimizer=opt, loss="categorical_crossentropy")
        model.fit(dataset, epochs=350)
    """

    def __init__(
        self,
        learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 0.001,
        rho: float = 0.953125,
        momentum: float = 0.9,
        epsilon: float = 1e-3,
        weight_decay_l2: float = 0.0,
        weight_decay_exclude: Sequence[str] = wd_lib.DEFAULT_WEIGHT_DECAY_EXCLUDE,
        **kwargs,
    ):
        super().__init__(learning_rate, momentum, weight_decay_l2, weight_decay_exclude,
                         **kwargs)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"`rho` must be in [0, 1]. Received: rho={rho}")
        if epsilon < 0.0:
            raise ValueError(f"`epsilon` must be >= 0. Received: epsilon={epsilon}")
        self.rho = rho
        self.epsilon = epsilon

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        # Initialised to 1, not 0: TF1's RMSProp starts from ms = 1 (see class docstring).
        self._mean_squares = self.add_optimizer_variables(var_list, "mean_square", "ones")
        self._momentums = self.add_optimizer_variables(var_list, "momentum")

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = self.decayed_gradient(gradient, variable, index)
        mean_square = self._mean_squares[index]
        momentum = self._momentums[index]
        self.assign(
            mean_square,
            ops.add(
                ops.multiply(self.rho, mean_square),
                ops.multiply(1.0 - self.rho, ops.square(gradient)),
            ),
        )
        step = ops.divide(ops.multiply(lr, gradient), ops.sqrt(mean_square + self.epsilon))
        self.assign(momentum, ops.add(ops.multiply(self.momentum, momentum), step))
        self.assign_sub(variable, momentum)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"rho": self.rho, "epsilon": self.epsilon})
        return config
