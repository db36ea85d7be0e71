"""Writes keras.applications-layout EfficientNet `.h5` files from randomized keras.applications
models: the stand-in for the ImageNet files, which tests must not download.

Used by tests/models/test_pretrained.py and by the notebook test (the notebook's fine-tuning cell
loads the file through `QUICKSTART_WEIGHTS` in CI). Run as a script to write one:
`python -m tests.models.keras_applications_h5 b0 /tmp/efficientnetb0.h5 [--notop]`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import keras
import numpy as np

KERAS_APPLICATIONS = {
    "b0": "EfficientNetB0", "b1": "EfficientNetB1", "b2": "EfficientNetB2",
    "b3": "EfficientNetB3", "b4": "EfficientNetB4", "b5": "EfficientNetB5",
    "b6": "EfficientNetB6", "b7": "EfficientNetB7",
}
# The layers keras.applications leaves out of its `_notop.h5` files.
TOP_LAYERS = ("avg_pool", "top_dropout", "predictions")
IMAGENET_MEAN_01 = (0.485, 0.456, 0.406)
IMAGENET_STD_01 = (0.229, 0.224, 0.225)
# Images in the pass that sets the BatchNorm statistics. The deepest stages of a 64px input run
# at 2x2 pixels, where 8 images left 32 values per channel: some channels' variances came out
# near zero, and under JAX (whose seeded kernels differ from TensorFlow's) B5's logits then moved
# by 9% when its input moved by one float32 ulp. With 32 images they move by 3e-5.
STATISTICS_IMAGES = 32


def randomized_keras_applications(variant: str = "b0", *, input_shape=(64, 64, 3),
                                  seed: int = 0, **kwargs) -> keras.Model:
    """`keras.applications.EfficientNet{B0..B7}(weights=None)` with every weight randomized.

    Kernels keep their (seeded) random initialization; scales, shifts and biases get random
    values, and each BatchNorm's moving statistics are those of one training-mode pass over
    `STATISTICS_IMAGES` random images (momentum 0 for that pass), so that the features still
    depend on the image after dozens of layers and a weight loaded into the wrong place shows in
    the outputs. The input normalization is ImageNet's mean and standard deviation, which is what
    keras.applications computes with its ImageNet weights and what our models compute.
    """
    keras.utils.set_random_seed(seed)
    builder = getattr(keras.applications, KERAS_APPLICATIONS[variant])
    model = builder(weights=None, input_shape=input_shape, **kwargs)
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        name, shape = weight.path.rsplit("/", 1)[-1], tuple(weight.shape)
        if name == "gamma":
            value = rng.uniform(0.5, 1.5, shape)
        elif name in ("beta", "bias"):
            value = rng.normal(0.0, 0.1, shape)
        elif weight.path.startswith("normalization") and name in ("mean", "variance"):
            value = IMAGENET_MEAN_01 if name == "mean" else np.square(IMAGENET_STD_01)
        else:
            continue
        weight.assign(np.asarray(value, "float32"))
    # keras.layers.Normalization computes with the statistics finalize_state() derives (found by
    # type: Keras names it "normalization_1" in the second model of a process).
    for layer in model.layers:
        if isinstance(layer, keras.layers.Normalization):
            layer.finalize_state()
    norms = [layer for layer in model.layers
             if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    height, width = (size or 64 for size in input_shape[:2])
    model(rng.uniform(0, 255, (STATISTICS_IMAGES, height, width, 3)).astype("float32"),
          training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum
    return model


def write_keras_applications_h5(model: keras.Model, path, *, include_top: bool = True) -> Path:
    """Writes `model`'s weights as keras.applications' EfficientNet files hold them.

    That is Keras 2's HDF5 weights layout: the root lists every layer in `layer_names`; each
    layer has a group listing its `weight_names` (`"stem_conv/kernel:0"`,
    `"block1a_dwconv/depthwise_kernel:0"`, ...), one dataset per name. `include_top=False`
    leaves out the pooling and classifier, as the `_notop.h5` files do.
    """
    import h5py

    layers = [layer for layer in model.layers if include_top or layer.name not in TOP_LAYERS]
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = [layer.name.encode("utf8") for layer in layers]
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.4.0"
        for layer in layers:
            group = f.create_group(layer.name)
            names = []
            for weight in layer.weights:
                short = weight.path.rsplit("/", 1)[-1]
                if isinstance(layer, keras.layers.DepthwiseConv2D) and short == "kernel":
                    short = "depthwise_kernel"  # Keras 2's name for it
                names.append(f"{layer.name}/{short}:0")
                group.create_dataset(names[-1], data=keras.ops.convert_to_numpy(weight))
            group.attrs["weight_names"] = [n.encode("utf8") for n in names]
    return Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=sorted(KERAS_APPLICATIONS))
    parser.add_argument("path")
    parser.add_argument("--notop", action="store_true", help="leave the classifier out")
    args = parser.parse_args()
    model = randomized_keras_applications(args.variant)
    print(write_keras_applications_h5(model, args.path, include_top=not args.notop))


if __name__ == "__main__":
    main()
