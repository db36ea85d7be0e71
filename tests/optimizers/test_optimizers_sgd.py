"""Momentum SGD: hand-computed steps with L2 on the gradient, exclusions, config round trip."""

import keras
import numpy as np
import pytest

from keras_efficientnet.optimizers import SGD
from tests.helpers import assert_config_round_trip


def _variable(value, path):
    """A float32 `keras.Variable` whose `path` is `path` ("scope/name")."""
    scope, name = path.split("/")
    with keras.name_scope(scope):
        return keras.Variable(np.asarray(value, "float32"), name=name)


def test_two_steps_by_hand_decay_skips_norm_beta():
    # Kernel: g' = 1 + 0.5 * 2 = 2, v1 = 0.1 * 2 = 0.2, w1 = 1.8;
    #         g' = 1 + 0.5 * 1.8 = 1.9, v2 = 0.9 * 0.2 + 0.19 = 0.37, w2 = 1.43.
    # Beta (excluded): v1 = 0.1, w1 = 1.9; v2 = 0.09 + 0.1 = 0.19, w2 = 1.71.
    kernel = _variable([2.0], "dense/kernel")
    beta = _variable([2.0], "bn/beta")
    opt = SGD(learning_rate=0.1, momentum=0.9, weight_decay_l2=0.5)
    for _ in range(2):
        opt.apply_gradients([(np.ones(1, "float32"), kernel), (np.ones(1, "float32"), beta)])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(kernel), [1.43], rtol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(beta), [1.71], rtol=1e-6)


def test_matches_keras_sgd_without_decay():
    # Same update as keras.optimizers.SGD when no decay is involved (an independent reference).
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(3, 2)).astype("float32")
    grads = [rng.normal(size=(3, 2)).astype("float32") for _ in range(3)]
    ours, theirs = keras.Variable(w0), keras.Variable(w0)
    opt_ours = SGD(learning_rate=0.05, momentum=0.8)
    opt_theirs = keras.optimizers.SGD(learning_rate=0.05, momentum=0.8)
    for g in grads:
        opt_ours.apply_gradients([(g, ours)])
        opt_theirs.apply_gradients([(g, theirs)])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs), rtol=1e-6
    )


def test_config_round_trip_with_exclusions():
    opt = SGD(
        learning_rate=0.2,
        momentum=0.5,
        weight_decay_l2=5e-5,
        weight_decay_exclude=[r"bias$"],
        global_clipnorm=2.0,
    )
    config = opt.get_config()
    assert config["weight_decay_exclude"] == [r"bias$"]
    assert "weight_decay" not in config
    assert_config_round_trip(opt)
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(revived, SGD)
    assert revived.get_config() == config


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"weight_decay": 1e-4}, "weight_decay_l2"),
        ({"momentum": 1.0}, "momentum=1.0"),
        ({"weight_decay_l2": -1.0}, "weight_decay_l2=-1.0"),
    ],
)
def test_invalid_arguments_raise_with_received_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SGD(**kwargs)
