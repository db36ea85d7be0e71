"""LARS: hand-computed steps, exclusions by path, compiled `fit` steps and config round trip."""

import copy

import keras
import numpy as np
import pytest

from keras_efficientnet.optimizers import LARS, WarmupSchedule
from tests.helpers import assert_config_round_trip


def _variable(value, path):
    """A float32 `keras.Variable` whose `path` is `path` ("scope/.../name")."""
    *scopes, name = path.split("/")
    if not scopes:
        return keras.Variable(np.asarray(value, "float32"), name=name)
    with keras.name_scope(scopes[0]):
        return _variable(value, "/".join(scopes[1:] + [name]))


def _lars_reference(w, grads, lr, momentum, eta, wd, epsilon=0.0, excluded=False):
    """NumPy float64 MLPerf LARS written from docs/recipes.md, independent of the implementation."""
    w = np.asarray(w, np.float64).copy()
    v = np.zeros_like(w)
    for g in grads:
        g = np.asarray(g, np.float64)
        if excluded:
            v = momentum * v + lr * g
        else:
            w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
            if w_norm > 0 and g_norm > 0:
                trust = eta * w_norm / (g_norm + wd * w_norm + epsilon)
            else:
                trust = 1.0
            v = momentum * v + lr * trust * (g + wd * w)
        w = w - v
    return w


def _apply(opt, variables, grads_per_step):
    for grads in grads_per_step:
        opt.apply_gradients(
            [(np.asarray(g, "float32"), v) for g, v in zip(grads, variables, strict=True)]
        )
    return [keras.ops.convert_to_numpy(v) for v in variables]


def test_one_step_by_hand_with_decay_and_excluded_bias():
    # ||w|| = 5, ||g|| = 1: trust = 0.1 * 5 / (1 + 0.2 * 5) = 0.25, g + wd w = (1.2, 1.6).
    kernel = _variable([3.0, 4.0], "dense/kernel")
    bias = _variable([3.0, 4.0], "dense/bias")
    opt = LARS(learning_rate=1.0, momentum=0.9, eta=0.1, weight_decay_l2=0.2)
    new_kernel, new_bias = _apply(opt, [kernel, bias], [[[0.6, 0.8], [0.6, 0.8]]])
    np.testing.assert_allclose(new_kernel, [2.7, 3.6], rtol=1e-6)
    # The bias is excluded: plain momentum SGD, v = lr * g, no decay, no trust ratio.
    np.testing.assert_allclose(new_bias, [2.4, 3.2], rtol=1e-6)


def test_two_steps_by_hand_momentum_carries_the_scaled_step():
    # Step 1: trust 0.1 * 5 / 1 = 0.5, v = (0.3, 0.4), w = (2.7, 3.6).
    # Step 2: trust 0.1 * 4.5 / 1 = 0.45, v = 0.9 v + 0.45 g = (0.54, 0.72), w = (2.16, 2.88).
    kernel = _variable([3.0, 4.0], "dense/kernel")
    opt = LARS(learning_rate=1.0, momentum=0.9, eta=0.1)
    (new_kernel,) = _apply(opt, [kernel], [[[0.6, 0.8]], [[0.6, 0.8]]])
    np.testing.assert_allclose(new_kernel, [2.16, 2.88], rtol=1e-6)


def test_two_steps_match_numpy_for_kernel_bias_norms_and_edge_cases():
    rng = np.random.default_rng(0)
    hyper = {"lr": 0.7, "momentum": 0.885, "eta": 0.02, "wd": 0.05, "epsilon": 1e-3}
    specs = [
        # (path, shape, excluded by default, weight is zero, gradients are zero)
        ("block1a/project_conv/kernel", (1, 1, 3, 4), False, False, False),
        ("predictions/bias", (4,), True, False, False),
        ("block1a/project_norm/gamma", (4,), True, False, False),
        ("block2a/expand_norm/beta", (4,), True, False, False),
        # Proxy-norm proxy parameters are not excluded: LARS and decay apply to them.
        ("block2a/expand_pn/proxy_gamma", (4,), False, False, False),
        ("zero_init/kernel", (3, 2), False, True, False),  # ||w|| = 0: trust is 1
        ("frozen/kernel", (3, 2), False, False, True),  # ||g|| = 0: trust 1, decay only
    ]
    variables, grads, expected, initial = [], [[], []], [], []
    for path, shape, excluded, zero_w, zero_g in specs:
        w = np.zeros(shape) if zero_w else rng.normal(size=shape)
        g = [np.zeros(shape) if zero_g else rng.normal(size=shape) for _ in range(2)]
        variables.append(_variable(w, path))
        grads[0].append(g[0])
        grads[1].append(g[1])
        w32 = w.astype("float32")
        initial.append(w32)
        g32 = [x.astype("float32") for x in g]
        expected.append(_lars_reference(w32, g32, excluded=excluded, **hyper))
    opt = LARS(
        learning_rate=hyper["lr"],
        momentum=hyper["momentum"],
        eta=hyper["eta"],
        weight_decay_l2=hyper["wd"],
        epsilon=hyper["epsilon"],
    )
    results = _apply(opt, variables, grads)
    for (path, *_), result, want in zip(specs, results, expected, strict=True):
        np.testing.assert_allclose(result, want, rtol=2e-5, atol=1e-6, err_msg=path)
    # With a zero gradient, the kernel still shrinks by decay, at trust 1: after step 1 it is
    # w0 (1 - lr wd), after step 2 w1 - (m lr wd w0 + lr wd w1).
    w0 = initial[-1]
    w1 = w0 * (1 - 0.7 * 0.05)
    np.testing.assert_allclose(
        results[-1], w1 - (0.885 * 0.7 * 0.05 * w0 + 0.7 * 0.05 * w1), rtol=1e-5
    )


def test_custom_exclude_regex_changes_which_variables_get_trust_ratio():
    kernel = _variable([3.0, 4.0], "head/kernel")
    bias = _variable([3.0, 4.0], "head/bias")
    opt = LARS(learning_rate=1.0, momentum=0.9, eta=0.1, exclude=[r"head/kernel$"])
    new_kernel, new_bias = _apply(opt, [kernel, bias], [[[0.6, 0.8], [0.6, 0.8]]])
    np.testing.assert_allclose(new_kernel, [2.4, 3.2], rtol=1e-6)  # plain SGD now
    np.testing.assert_allclose(new_bias, [2.7, 3.6], rtol=1e-6)  # trust 0.5 now


def _linear_mse_grads(x, t, kernel, bias):
    """Gradients of keras "mse" (mean over every element) for y = x @ kernel + bias."""
    residual = x @ kernel + bias - t
    scale = 2.0 / residual.size
    return scale * x.T @ residual, scale * residual.sum(axis=0)


def test_compiled_fit_steps_match_numpy():
    # Runs the optimizer inside `fit` (tf.function / jitted stateless apply on JAX).
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 3)).astype("float32")
    t = rng.normal(size=(16, 2)).astype("float32")
    kernel0 = rng.normal(size=(3, 2)).astype("float32")
    bias0 = np.array([0.5, -0.5], "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="predictions")])
    model.set_weights([kernel0, bias0])
    opt = LARS(learning_rate=2.0, momentum=0.885, eta=0.05, weight_decay_l2=0.01)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, t, batch_size=8, epochs=1, shuffle=False, verbose=0)

    kernel, bias = kernel0.astype(np.float64), bias0.astype(np.float64)
    v_kernel, v_bias = np.zeros_like(kernel), np.zeros_like(bias)
    for batch in (slice(0, 8), slice(8, 16)):
        g_kernel, g_bias = _linear_mse_grads(x[batch], t[batch], kernel, bias)
        w_norm, g_norm = np.linalg.norm(kernel), np.linalg.norm(g_kernel)
        trust = 0.05 * w_norm / (g_norm + 0.01 * w_norm)
        v_kernel = 0.885 * v_kernel + 2.0 * trust * (g_kernel + 0.01 * kernel)
        v_bias = 0.885 * v_bias + 2.0 * g_bias
        kernel, bias = kernel - v_kernel, bias - v_bias
    got_kernel, got_bias = model.get_weights()
    np.testing.assert_allclose(got_kernel, kernel, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_bias, bias, rtol=1e-4, atol=1e-5)


def test_fit_reduces_loss_of_tiny_dense_model():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 8)).astype("float32")
    t = x @ rng.normal(size=(8, 1)).astype("float32") + 0.5
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    # The excluded bias steps with the global rate, so it cannot be LARS-sized (~10).
    model.compile(optimizer=LARS(learning_rate=0.1, eta=0.1), loss="mse")
    history = model.fit(x, t, batch_size=16, epochs=6, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < 0.5 * losses[0], losses


def test_config_round_trip_with_exclusions_and_schedule():
    schedule = WarmupSchedule(
        8.485, 70, "polynomial", total_steps=350, end_learning_rate=8.5e-5, power=2.0
    )
    opt = LARS(
        learning_rate=schedule,
        momentum=0.885,
        eta=0.001,
        epsilon=0.0,
        weight_decay_l2=2.5e-6,
        exclude=[r"(^|/)gamma$", r"^stem_conv/"],
        clipnorm=1.0,
    )
    config = opt.get_config()
    assert config["exclude"] == [r"(^|/)gamma$", r"^stem_conv/"]
    assert "weight_decay" not in config
    # Not the shared helper: `Optimizer.from_config` replaces the serialized schedule in the dict
    # it is given by the schedule object, so the config must be copied first.
    restored = LARS.from_config(copy.deepcopy(config))
    assert restored.get_config() == config
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(revived, LARS)
    assert revived.get_config() == config


def test_default_config_lists_default_exclusions():
    opt = LARS()
    assert_config_round_trip(opt)
    config = opt.get_config()
    assert config["exclude"] == [r"(^|/)gamma$", r"(^|/)beta$", r"(^|/)bias$"]
    assert (config["momentum"], config["eta"], config["epsilon"], config["weight_decay_l2"]) == (
        0.9,
        0.001,
        0.0,
        0.0,
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"weight_decay": 1e-4}, "weight_decay_l2"),
        ({"momentum": 1.0}, "momentum=1.0"),
        ({"eta": 0.0}, "eta=0.0"),
        ({"epsilon": -1.0}, "epsilon=-1.0"),
        ({"weight_decay_l2": -1.0}, "weight_decay_l2=-1.0"),
        ({"exclude": ["("]}, "Invalid regex"),
    ],
)
def test_invalid_arguments_raise_with_received_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LARS(**kwargs)


def test_single_string_exclude_is_rejected():
    with pytest.raises(TypeError, match="not a single string"):
        LARS(exclude=r"bias$")
