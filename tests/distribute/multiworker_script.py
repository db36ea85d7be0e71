"""Run as a process: train the tiny model 3 steps as one multi-worker worker, or as one process.

`python multiworker_script.py worker OUT.npz` reads TF_CONFIG (set by the test);
`python multiworker_script.py single OUT.npz` (or `single()`, which multidevice_script.py calls
to save a process) is the independent reference: a plain GradientTape step on the whole global
batch. Both save the final weights.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_efficientnet.distribute.plan import plan  # noqa: E402

GLOBAL_BATCH, STEPS = 8, 3
LOSS = keras.losses.CategoricalCrossentropy()


def tiny():
    import keras_efficientnet as ke

    keras.utils.set_random_seed(0)
    return ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="layer", proxy_norm=True,
                           classes=4, input_shape=(32, 32, 3), dropout_rate=0.0,
                           drop_connect_rate=0.0)


def batches():
    rng = np.random.default_rng(7)
    for _ in range(STEPS):
        x = rng.integers(0, 256, (GLOBAL_BATCH, 32, 32, 3)).astype("uint8")
        y = np.eye(4, dtype="float32")[rng.integers(0, 4, GLOBAL_BATCH)]
        yield tf.constant(x), tf.constant(y)


def optimizer():
    return keras.optimizers.SGD(0.005, momentum=0.9)


def save(out: str, losses: list[float], model: keras.Model) -> None:
    weights = {f"w{i:03d}": w for i, w in enumerate(model.get_weights())}
    np.savez(out, losses=np.array(losses), **weights)


def main(mode: str, out: str) -> None:
    if mode == "worker":
        # The strategy comes first: MultiWorkerMirroredStrategy must start before other TF ops.
        runtime = plan("multiworker", replicas=2, micro_batch_size=GLOBAL_BATCH // 2,
                       print_plan=False)
        runtime.strategy  # noqa: B018 - starts the cluster (and probes the peer) now
        with runtime.scope():
            model, opt = tiny(), optimizer()
        step = runtime.train_step(model, opt, LOSS)
        losses = [float(step(*runtime.distribute(x, y))) for x, y in batches()]
        save(out, losses, model)
    else:
        single(out)


def single(out: str) -> None:
    """The reference: one process, a plain GradientTape step on each whole global batch."""
    model, opt = tiny(), optimizer()
    opt.build(model.trainable_variables)
    losses = []
    for x, y in batches():
        with tf.GradientTape() as tape:
            value = LOSS(y, model(x, training=True))
        opt.apply(tape.gradient(value, model.trainable_variables), model.trainable_variables)
        losses.append(float(value))
    save(out, losses, model)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
