"""One process's grouped-conv results under the TF_ENABLE_ONEDNN_OPTS it was started with.

Run by `test_group_conv_onednn.py` as `python -m tests.layers.onednn_paths_script OUT.npz`, or
called in the test's own process (`run`) for the setting that process started with. It saves,
for each case, the forward output and d/dx, d/dkernel of sum(upstream * conv) through
`GroupConv2D`'s TensorFlow path, the path it took, and the loss and weights before and after one
training step of `efficientnet-tiny-g16-lnpn`, so that the parent can hold both settings to
NumPy and to each other, and what `runs.environment` says of this process.
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import keras_efficientnet as ke
from keras_efficientnet.layers.group_conv import grouped_gradient_available, tf_conv_path
from keras_efficientnet.runs.environment import environment

# channels, filters, group_size, kernel, strides: few groups (per-group convs on every CPU) and
# many groups (one grouped kernel where its gradient exists).
CASES = [(64, 64, 16, 3, 1), (48, 48, 4, 3, 2), (320, 320, 16, 5, 1), (192, 384, 16, 3, 2)]


def conv_case(channels, filters, group_size, kernel, strides, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 7, 9, channels)).astype("float32")
    layer = ke.layers.GroupConv2D(filters, kernel, strides, group_size=group_size)
    layer.build(x.shape)
    kernel_value = rng.standard_normal(layer.kernel.shape).astype("float32")
    layer.kernel.assign(kernel_value)
    xt = tf.constant(x)

    @tf.function(jit_compile=False)  # the graph path the trainer takes
    def step(xt):
        with tf.GradientTape() as tape:
            tape.watch(xt)
            y = layer(xt)
            loss = tf.reduce_sum(y * upstream)
        return (y, *tape.gradient(loss, [xt, layer.kernel.value]))

    upstream = tf.constant(rng.standard_normal(
        layer.compute_output_shape(x.shape)).astype("float32"))
    y, dx, dk = step(xt)
    path = tf_conv_path(channels // group_size, channels, filters, "CPU", "float32")
    return {"x": x, "kernel": kernel_value, "upstream": upstream.numpy(), "y": y.numpy(),
            "dx": dx.numpy(), "dk": dk.numpy()}, path


def training_step():
    """Loss, and weights before and after one SGD step of the tiny G16-LN+PN model from a fixed
    seed."""
    keras.utils.set_random_seed(0)
    model = ke.EfficientNet.from_preset("efficientnet-tiny-g16-lnpn", input_shape=(32, 32, 3),
                                        classes=10, classifier_activation=None,
                                        drop_connect_rate=0.0, dropout_rate=0.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (8, 32, 32, 3)).astype("uint8")
    labels = rng.integers(0, 10, 8)
    initial = np.concatenate([w.ravel() for w in model.get_weights()])
    # Built here, not inside the first trace of the step (Keras' default without a strategy),
    # which made TensorFlow trace the step twice.
    model.optimizer.build(model.trainable_variables)
    loss = float(model.train_on_batch(images, labels))
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    return loss, initial, weights


def run(out: str) -> dict:
    """Saves the arrays to `out` and returns the report (paths, cases, loss, probe result)."""
    arrays, paths = {}, []
    for i, case in enumerate(CASES):
        result, path = conv_case(*case, seed=i)
        arrays.update({f"{i}_{k}": v for k, v in result.items()})
        paths.append(path)
    loss, initial, weights = training_step()
    np.savez(out, loss=loss, initial=initial, weights=weights, **arrays)
    return {"paths": paths, "cases": CASES, "loss": loss,
            "grouped_gradient": grouped_gradient_available("CPU", "float32"),
            # What a run's results.json and the benchmark rows record for this process.
            "environment": environment()}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
