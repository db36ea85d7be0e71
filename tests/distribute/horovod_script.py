"""Run as `horovodrun -np 2 python -m tests.distribute.horovod_script OUT`: 3 horovod steps on a
small model; rank 0 also runs a reference.

Saves each rank's final weights and (rank 0) a single-process run on the whole batch, starting
from rank 0's initial weights, to the folder given as the first argument.
"""

import os
import sys

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from keras_efficientnet.distribute import horovod

LOSS = keras.losses.CategoricalCrossentropy()


def small_model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(inputs))


def flat(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.ravel(w) for w in model.get_weights()])


def main(out: str) -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = small_model(10 + rank)  # different on purpose: the broadcast must align them
    horovod.broadcast_variables(model.variables)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * size, 3)).astype("float32")
    y = np.eye(2, dtype="float32")[rng.integers(0, 2, 4 * size)]
    step = horovod.make_horovod_train_step(model, keras.optimizers.SGD(0.5), LOSS)
    for _ in range(3):
        step(tf.constant(x[4 * rank:4 * rank + 4]), tf.constant(y[4 * rank:4 * rank + 4]))
    np.save(os.path.join(out, f"rank{rank}.npy"), flat(model))
    if rank == 0:
        reference = small_model(10)
        optimizer = keras.optimizers.SGD(0.5)
        optimizer.build(reference.trainable_variables)
        for _ in range(3):
            with tf.GradientTape() as tape:
                value = LOSS(y, reference(x))
            grads = tape.gradient(value, reference.trainable_variables)
            optimizer.apply(grads, reference.trainable_variables)
        np.save(os.path.join(out, "reference.npy"), flat(reference))


if __name__ == "__main__":
    main(sys.argv[1])
