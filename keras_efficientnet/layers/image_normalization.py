"""On-device normalization of uint8 images, so the host can send a quarter of the bytes."""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def _kind(dtype) -> str:
    dtype = keras.backend.standardize_dtype(dtype)
    if "int" in dtype:
        return "int"
    return "float" if "float" in dtype else "other"


def check_input_dtype(input_dtype) -> None:
    """Raises a ValueError unless `input_dtype` is an integer (uint8) or float dtype."""
    try:
        kind = _kind(input_dtype)
    except ValueError:
        kind = "other"
    if kind == "other":
        raise ValueError(f"input_dtype must be 'uint8' (pixels in [0, 255]) or a float dtype such "
                         f"as 'float32' (float pixels in [0, 255]), received {input_dtype!r}")


def _in_keras_scratch_graph(images) -> bool:
    # Under a tf.distribute strategy, Keras' `fit` first builds the model from the *mean* of a
    # batch over the replicas, a float even for uint8 images, in a throw-away graph that Keras
    # names "scratch_graph..."; no data flows there, so nothing can be misread.
    graph = getattr(images, "graph", None)  # TensorFlow graph tensors only
    return str(getattr(graph, "name", "")).startswith("scratch_graph")


def check_image_dtype(images, input_dtype, where: str) -> None:
    """Refuses float `images` for an integer (uint8) model input, which would truncate them.

    Casting float pixels to uint8 drops their fraction: images in [0, 1] become 0s and 1s, an
    almost black picture, and the model's predictions are silently wrong. Objects without a
    dtype (Python lists) are left to Keras.
    """
    dtype = getattr(images, "dtype", None)
    if dtype is None or _kind(input_dtype) != "int" or _in_keras_scratch_graph(images):
        return
    dtype = keras.backend.standardize_dtype(dtype)
    if _kind(dtype) == "float":
        raise ValueError(
            f"{where} takes {input_dtype} images with pixel values in [0, 255], received "
            f"{dtype} images, which the {input_dtype} input would truncate to integers (images "
            f"in [0, 1] would turn almost black). Pass {input_dtype} pixels, e.g. "
            f"`np.round(images * 255).astype('{input_dtype}')` for images in [0, 1], or build "
            "the model with input_dtype='float32' to feed float pixels in [0, 255]")


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class ImageNormalization(keras.layers.Layer):
    """Casts images to the compute dtype and applies `(x - mean) / std` per channel.

    The first layer of every EfficientNet here: the host pipeline sends uint8 and the arithmetic
    happens on the accelerator. The input is RGB pixel values in [0, 255], as uint8 or as float
    (float images in [0, 1] must be multiplied by 255 first: the layer cannot tell them apart
    from dark images). Inputs that are neither integer nor float are refused.

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
        if _kind(inputs.dtype) == "other":
            raise ValueError(f"{self.name}: images must be integer (uint8) or float pixels in "
                             f"[0, 255], received dtype {inputs.dtype}")
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
