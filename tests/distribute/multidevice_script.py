"""Run in a fresh process: pipelined and mirrored steps on logical CPUs vs unsplit references.

Prints one JSON object of measured differences, which test_distribute_multiprocess.py asserts
on; given a path, also saves the multi-worker test's single-process reference weights there.
Device configuration must precede TensorFlow's initialisation, hence a separate process.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_efficientnet.distribute import strategies  # noqa: E402

DEVICES = strategies.configure_logical_cpus(4)

import keras_efficientnet as ke  # noqa: E402
from keras_efficientnet.distribute import pipeline  # noqa: E402
from keras_efficientnet.distribute.plan import plan  # noqa: E402

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


def sgd_step(step_of_optimizer, model, x, y):
    """Gradients as measured by one plain-SGD step with learning rate 1: w_before - w_after."""
    before = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    step = step_of_optimizer(keras.optimizers.SGD(1.0))
    loss = float(step(x, y))
    after = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    return loss, [b - a for b, a in zip(before, after)]


out = {"devices": DEVICES}
base = tiny()
x, y = data(1)
ref = reference_gradients(base, x, y)
out["grad_scale"] = float(max(np.max(np.abs(g)) for g in ref))
out["reference_loss"] = float(LOSS(y, base(x, training=True)))

# Two stages: the compiled train step (GPipe schedule in one graph), gradients read back from a
# plain-SGD update. Four stages: the same code run eagerly, which is much cheaper than tracing.
model = clone(base)
pipe = pipeline.PipelinedModel(model, ("block3a",), micro_batches=2)
forward = max_diff([pipe(x)], [base(x)])
loss, grads = sgd_step(lambda opt: pipe.make_train_step(opt, LOSS), model, x, y)
out["two"] = {"devices": pipe.devices, "grad_diff": max_diff(grads, ref), "loss": loss,
              "forward_diff": forward}
pipe = pipeline.PipelinedModel(clone(base), ("block2a", "block4a", "block6a"), micro_batches=2)
loss, grads = pipe.compute_gradients(x, y, LOSS)
out["four"] = {"devices": pipe.devices, "grad_diff": max_diff(grads, ref), "loss": float(loss),
               "forward_diff": max_diff([pipe(x)], [base(x)])}

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

# Mirrored over 2 logical CPUs against the single-device reference gradients.
runtime = plan("mirrored", replicas=2, micro_batch_size=BATCH // 2, print_plan=False)
with runtime.scope():
    model = clone(base)
loss, grads = sgd_step(
    lambda opt: (lambda a, b, s=runtime.train_step(model, opt, LOSS): s(*runtime.distribute(a, b))),
    model, x, y)
out["mirrored"] = {"replicas": runtime.strategy.num_replicas_in_sync, "loss": loss,
                   "grad_diff": max_diff(grads, ref)}
# The trainer under each plan against Keras' `fit` on one device, same global batch of 16:
# mirrored 2 x 8 (Keras fit under MirroredStrategy), and 2 pipeline stages x 2 micro-batches of
# 8 (the project's loop). The one-device run is also the multi-worker test's reference.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_runs  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    reference = trainer_runs.train_run(f"{tmp}/one", one_device=True)
    runs = {
        "mirrored": trainer_runs.train_run(f"{tmp}/mirrored", backend="mirrored", replicas=2,
                                           micro_batch_size=8),
        # --steps_per_epoch counts micro-batches: 4 of 8 = 2 optimizer steps of 16.
        "pipelined": trainer_runs.train_run(f"{tmp}/pipelined", pipeline_splits="block3a",
                                            micro_batch_size=8, gradient_accumulation=2,
                                            steps_per_epoch=4, device_iterations=2),
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
