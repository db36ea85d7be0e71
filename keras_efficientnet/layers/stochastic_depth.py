"""Stochastic depth (drop-connect): drops a residual branch per sample during training."""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class StochasticDepth(keras.layers.Layer):
    """Zeroes the whole input of a sample with probability `rate`, rescaling survivors.

    Applied to the residual branch before the skip addition (Huang et al. 2016). Survivors are
    divided by `1 - rate` so the expected output equals the input; inference is the identity.

    Args:
        rate: drop probability in [0, 1). Default 0.
        seed: optional int seed for the drop mask.

    Example:
        >>> drop = StochasticDepth(0.2)
        >>> y = drop(np.ones((8, 4, 4, 16), "float32"), training=True)
    """

    def __init__(self, rate: float = 0.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"StochasticDepth: rate must be in [0, 1), received {rate!r}")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if self.rate > 0 else None

    def call(self, inputs, training=None):
        if not training or self.rate == 0.0:
            return inputs
        survival = 1.0 - self.rate
        shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        noise = keras.random.uniform(shape, seed=self.seed_generator, dtype=inputs.dtype)
        mask = ops.floor(survival + noise)
        return inputs * mask / survival

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate, seed=self.seed)
        return config
