"""On-device normalization of uint8 images, so the host can send a quarter of the bytes."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class ImageNormalization(keras.layers.Layer):
    """Casts images (uint8 in [0, 255] or float) and applies `(x - mean) / std` per channel.

    The first layer of every EfficientNet here: the host pipeline sends uint8 and the arithmetic
    happens on the accelerator.

    Args:
        mean: per-channel mean in pixel units. Default ImageNet's, times 255.
        std: per-channel standard deviation in pixel units. Default ImageNet's, times 255.

    Example:
        >>> norm = ImageNormalization()
        >>> norm(np.full((1, 2, 2, 3), 255, "uint8")).dtype
        'float32'
    """

    def __init__(self, mean=IMAGENET_MEAN, std=IMAGENET_STD, **kwargs):
        super().__init__(**kwargs)
        mean = tuple(float(m) for m in mean)
        std = tuple(float(s) for s in std)
        if len(mean) != len(std) or not all(s > 0 for s in std):
            raise ValueError(
                "ImageNormalization: mean and std need one entry per channel and std > 0, "
                f"received mean={mean}, std={std}")
        self.mean = mean
        self.std = std

    def build(self, input_shape):
        if input_shape[-1] != len(self.mean):
            raise ValueError(
                f"{self.name}: images have {input_shape[-1]} channels but mean/std have "
                f"{len(self.mean)} entries")

    def call(self, inputs):
        x = ops.cast(inputs, self.compute_dtype)
        mean = np.asarray(self.mean, "float32")
        inv_std = 1.0 / np.asarray(self.std, "float32")
        return (x - ops.cast(mean, self.compute_dtype)) * ops.cast(inv_std, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(mean=list(self.mean), std=list(self.std))
        return config
