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


def trainable_count(model: keras.Model) -> int:
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def backend() -> str:
    return keras.backend.backend()
