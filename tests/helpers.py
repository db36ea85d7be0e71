"""Test helpers shared across test modules."""

from __future__ import annotations

import copy

import keras
import numpy as np


def assert_config_round_trip(obj) -> None:
    """`type(obj).from_config(obj.get_config())` rebuilds an object with an equal config."""
    config = obj.get_config()
    # Deep copy: Keras' Optimizer.from_config rewrites a nested schedule in the dict it gets.
    clone = type(obj).from_config(copy.deepcopy(config))
    assert clone.get_config() == config


def softmax(logits) -> np.ndarray:
    """NumPy softmax over the last axis, in the logits' own dtype."""
    logits = np.asarray(logits)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def trainable_count(model: keras.Model) -> int:
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def backend() -> str:
    return keras.backend.backend()


def tiny_sgd_model(seed: int = 0, *, built: bool = False) -> keras.Model:
    """Dense model with a dropout (so the random state matters) compiled with momentum SGD (so
    the optimizer has slots): the smallest model whose checkpoint holds every kind of state.
    `built=True` takes one step so that the optimizer's variables exist."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5),
                              keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse",
                  jit_compile=False)
    if built:
        model.fit(np.ones((8, 4)), np.ones((8, 3)), verbose=0)
    return model
