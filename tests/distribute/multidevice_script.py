"""Run in a fresh process: pipelined and mirrored steps on logical CPUs vs unsplit references.

`python -m tests.distribute.multidevice_script [OUT.npz]` prints one JSON object of measured
differences, which test_distribute_multiprocess.py asserts on; given a path, it also saves the
multi-worker test's one-device reference weights there. Device configuration must precede
TensorFlow's initialisation, hence a separate process.
"""

import json
import sys
import tempfile

from keras_efficientnet.distribute import devices

DEVICES = devices.configure_logical_cpus(4)

import keras  # noqa: E402 - after the CPU split, which must come before TensorFlow starts
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_efficientnet as ke  # noqa: E402
from keras_efficientnet.distribute import pipeline  # noqa: E402
from tests.distribute import trainer_runs  # noqa: E402

BATCH, MICRO = 8, 4
LOSS = keras.losses.CategoricalCrossentropy()


def tiny(norm="layer"):
    keras.utils.set_random_seed(0)
    return ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm=norm,
                           proxy_norm=norm != "batch", classes=4, input_shape=(32, 32, 3),
                           dropout_rate=0.0, drop_connect_rate=0.0)


def clone(model, norm="layer"):
    other = tiny(norm)
    other.set_weights(model.get_weights())
    return other


def data(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (BATCH, 32, 32, 3)).astype("uint8")
    y = np.eye(4, dtype="float32")[rng.integers(0, 4, BATCH)]
    return tf.constant(x), tf.constant(y)


def reference_gradients(model, x, y, pieces=1):
    """Independent reference: tf.GradientTape on the unsplit model, mean loss per piece."""
    total = None
    for xs, ys in zip(tf.split(x, pieces), tf.split(y, pieces)):
        with tf.GradientTape() as tape:
            value = LOSS(ys, model(xs, training=True)) / pieces
        grads = tape.gradient(value, model.trainable_variables)
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    return total


def max_diff(a, b):
    return float(max(np.max(np.abs(np.asarray(u) - np.asarray(v))) for u, v in zip(a, b)))


out = {"devices": DEVICES}
base = tiny()
x, y = data(1)
ref = reference_gradients(base, x, y)
out["grad_scale"] = float(max(np.max(np.abs(g)) for g in ref))
out["reference_loss"] = float(LOSS(y, base(x, training=True)))

# Two and four stages, eagerly (tracing is what costs here; the compiled step runs in the
# trainer's pipelined run below, which must end at the one-device weights).
for name, splits in (("two", ("block3a",)), ("four", ("block2a", "block4a", "block6a"))):
    pipe = pipeline.PipelinedModel(clone(base), splits, micro_batches=2)
    loss, grads = pipe.compute_gradients(x, y, LOSS)
    out[name] = {"devices": pipe.devices, "grad_diff": max_diff(grads, ref),
                 # Keras' layers on both sides: the stages run them one by one, and an
                 # inference call of the whole model would take its fused pass instead.
                 "loss": float(loss),
                 "forward_diff": max_diff([pipe(x)], [base(x, fused=False)])}

try:
    pipeline.PipelinedModel(clone(base), ("block2a", "block3a", "block4a", "block5a"))
    out["too_many_stages"] = ""
except ValueError as error:
    out["too_many_stages"] = str(error)

# BatchNorm: refused by default; when allowed, each micro-batch uses its own statistics, so the
# step equals accumulation over micro-batches on the unsplit model (checked eagerly: cheaper).
bn = tiny("batch")
try:
    pipeline.PipelinedModel(bn, ("block3a",), micro_batches=2)
    out["bn_refused"] = ""
except ValueError as error:
    out["bn_refused"] = str(error)
bn_pipe = pipeline.PipelinedModel(bn, ("block3a",), micro_batches=2, allow_batch_norm=True)
_, bn_grads = bn_pipe.compute_gradients(x, y, LOSS)
bn_ref = clone(bn, "batch")
accumulated = reference_gradients(bn_ref, x, y, 2)
out["bn_scale"] = float(max(np.max(np.abs(g)) for g in accumulated))
out["bn_vs_accumulated"] = max_diff(bn_grads, accumulated)
out["bn_vs_full_batch"] = max_diff(bn_grads, reference_gradients(bn_ref, x, y, 1))

# The trainer under each plan against Keras' `fit` on one device, same global batch of 16 and 2
# updates: mirrored 2 x 8 (Keras fit under MirroredStrategy); mirrored 2 replicas x 2
# accumulated micro-batches of 4 (the project's accumulating step, `distribute_batch` and loop);
# 2 pipeline stages x 2 micro-batches of 8 (the compiled GPipe step in the project's loop). The
# one-device run is also the multi-worker test's reference.
with tempfile.TemporaryDirectory() as tmp:
    reference = trainer_runs.train_run(f"{tmp}/one", one_device=True)
    runs = {
        "mirrored": trainer_runs.train_run(f"{tmp}/mirrored", strategy="mirrored", replicas=2,
                                           micro_batch_size=8),
        "mirrored_accumulating": trainer_runs.train_run(
            f"{tmp}/mirrored_accumulating", strategy="mirrored", replicas=2,
            micro_batch_size=4, gradient_accumulation=2, device_iterations=2),
        "pipelined": trainer_runs.train_run(f"{tmp}/pipelined", pipeline_splits="block3a",
                                            micro_batch_size=8, gradient_accumulation=2,
                                            device_iterations=2),
    }
out["trainer"] = {"reference_losses": reference["losses"]}
for name, run in runs.items():
    out["trainer"][name] = {
        "losses": run["losses"],
        "weight_diff": trainer_runs.max_relative_diff(run["weights"], reference["weights"]),
        "moved": trainer_runs.max_relative_diff(run["initial"], reference["weights"])}
print("RESULT " + json.dumps(out))
if len(sys.argv) > 1:
    trainer_runs.save(sys.argv[1], reference)
