"""RMSPropTF: hand-computed TF1-style steps, L2 exclusions, a compiled `fit` step, config."""

import keras
import numpy as np
import pytest

from keras_efficientnet.optimizers import RMSPropTF, WarmupSchedule
from tests.helpers import assert_config_round_trip


def _variable(value, path):
    """A float32 `keras.Variable` whose `path` is `path` ("scope/.../name")."""
    *scopes, name = path.split("/")
    if not scopes:
        return keras.Variable(np.asarray(value, "float32"), name=name)
    with keras.name_scope(scopes[0]):
        return _variable(value, "/".join(scopes[1:] + [name]))


def _rmsprop_tf_reference(w, grads, lrs, rho, momentum, epsilon, wd):
    """NumPy float64 TF1 RMSProp per docs/recipes.md (ms starts at 1, epsilon in the sqrt)."""
    w = np.asarray(w, np.float64).copy()
    ms, mom = np.ones_like(w), np.zeros_like(w)
    for g, lr in zip(grads, lrs, strict=True):
        g = np.asarray(g, np.float64) + wd * w
        ms = rho * ms + (1 - rho) * g**2
        mom = momentum * mom + lr * g / np.sqrt(ms + epsilon)
        w = w - mom
    return w


def _apply(opt, variables, grads_per_step):
    for grads in grads_per_step:
        opt.apply_gradients(
            [(np.asarray(g, "float32"), v) for g, v in zip(grads, variables, strict=True)]
        )
    return [keras.ops.convert_to_numpy(v) for v in variables]


def test_defaults_are_the_paper_recipe():
    config = RMSPropTF().get_config()
    assert config["rho"] == 0.953125
    assert config["momentum"] == 0.9
    assert config["epsilon"] == 1e-3
    assert config["weight_decay_exclude"] == [r"(^|/)gamma$", r"(^|/)beta$"]


def test_one_step_by_hand():
    # rho = 61/64, g = 2: ms = 61/64 + 3/64 * 4 = 73/64; with epsilon = 27/64 the root is
    # sqrt(100/64) = 1.25, so mom = 0.5 * 2 / 1.25 = 0.8. Keras' RMSprop (ms from 0) would step
    # 0.5 * 2 / sqrt(12/64 + 27/64) ~ 1.28 instead.
    kernel = _variable([1.0, -1.0], "dense/kernel")
    opt = RMSPropTF(learning_rate=0.5, epsilon=27 / 64)
    (new_kernel,) = _apply(opt, [kernel], [[[2.0, -2.0]]])
    np.testing.assert_allclose(new_kernel, [0.2, -0.2], rtol=1e-6)


def test_one_step_by_hand_l2_on_gradient_skips_norm_gamma():
    # Kernel: g + wd w = 1 + 0.1 * 10 = 2, so the step is again 0.8.
    # Gamma (excluded): g = 1, ms = 1, step = 0.5 / sqrt(1 + 27/64) = 0.5 * 8 / sqrt(91).
    kernel = _variable([10.0], "stem_conv/kernel")
    gamma = _variable([10.0], "stem_norm/gamma")
    opt = RMSPropTF(learning_rate=0.5, epsilon=27 / 64, weight_decay_l2=0.1)
    new_kernel, new_gamma = _apply(opt, [kernel, gamma], [[[1.0], [1.0]]])
    np.testing.assert_allclose(new_kernel, [9.2], rtol=1e-6)
    np.testing.assert_allclose(new_gamma, [10.0 - 4.0 / np.sqrt(91.0)], rtol=1e-6)


def test_two_steps_match_numpy_for_kernel_bias_norms_and_proxy():
    rng = np.random.default_rng(0)
    lr, wd = 0.046875, 0.02
    specs = [
        # (path, shape, excluded from decay by default)
        ("block1a/dwconv/kernel", (3, 3, 1, 4), False),
        ("predictions/bias", (4,), False),  # the RMSProp recipe decays biases
        ("block1a/project_norm/gamma", (4,), True),
        ("block1a/project_norm/beta", (4,), True),
        ("block2a/expand_pn/gamma", (4,), True),
        ("block2a/expand_pn/proxy_beta", (4,), False),  # pulled back towards N(0, 1)
        ("block2a/expand_pn/proxy_gamma", (4,), False),
    ]
    variables, grads, expected = [], [[], []], []
    for path, shape, excluded in specs:
        w = rng.normal(size=shape).astype("float32")
        g = [rng.normal(size=shape).astype("float32") for _ in range(2)]
        variables.append(_variable(w, path))
        grads[0].append(g[0])
        grads[1].append(g[1])
        expected.append(
            _rmsprop_tf_reference(w, g, [lr, lr], 0.953125, 0.9, 1e-3, 0.0 if excluded else wd)
        )
    opt = RMSPropTF(learning_rate=lr, weight_decay_l2=wd)
    results = _apply(opt, variables, grads)
    for (path, *_), result, want in zip(specs, results, expected, strict=True):
        np.testing.assert_allclose(result, want, rtol=2e-5, atol=1e-6, err_msg=path)


def test_compiled_fit_steps_with_warmup_schedule_match_numpy():
    # Inside `fit` (tf.function / jitted stateless apply on JAX), with a schedule whose rate
    # differs between the two steps: 0.02 at step 0, 0.06 at step 1.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 3)).astype("float32")
    t = rng.normal(size=(16, 2)).astype("float32")
    kernel0 = rng.normal(size=(3, 2)).astype("float32")
    bias0 = np.array([0.5, -0.5], "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="predictions")])
    model.set_weights([kernel0, bias0])
    schedule = WarmupSchedule(0.1, warmup_steps=2, warmup_start_learning_rate=0.02)
    opt = RMSPropTF(learning_rate=schedule, weight_decay_l2=0.05, weight_decay_exclude=["bias$"])
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, t, batch_size=8, epochs=1, shuffle=False, verbose=0)

    kernel, bias = kernel0.astype(np.float64), bias0.astype(np.float64)
    ms_k, ms_b = np.ones_like(kernel), np.ones_like(bias)
    mom_k, mom_b = np.zeros_like(kernel), np.zeros_like(bias)
    for lr, batch in ((0.02, slice(0, 8)), (0.06, slice(8, 16))):
        residual = x[batch] @ kernel + bias - t[batch]
        g_k = 2.0 / residual.size * x[batch].T @ residual + 0.05 * kernel
        g_b = 2.0 / residual.size * residual.sum(axis=0)
        ms_k = 0.953125 * ms_k + 0.046875 * g_k**2
        ms_b = 0.953125 * ms_b + 0.046875 * g_b**2
        mom_k = 0.9 * mom_k + lr * g_k / np.sqrt(ms_k + 1e-3)
        mom_b = 0.9 * mom_b + lr * g_b / np.sqrt(ms_b + 1e-3)
        kernel, bias = kernel - mom_k, bias - mom_b
    got_kernel, got_bias = model.get_weights()
    np.testing.assert_allclose(got_kernel, kernel, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_bias, bias, rtol=1e-4, atol=1e-6)


def test_config_round_trip_with_exclusions():
    opt = RMSPropTF(
        learning_rate=0.046875,
        rho=0.9,
        momentum=0.8,
        epsilon=1e-2,
        weight_decay_l2=1e-5,
        weight_decay_exclude=[r"(^|/)gamma$", r"_pn/"],
        use_ema=True,
        name="rms",
    )
    config = opt.get_config()
    assert config["weight_decay_exclude"] == [r"(^|/)gamma$", r"_pn/"]
    assert config["weight_decay_l2"] == 1e-5
    assert "weight_decay" not in config
    assert_config_round_trip(opt)
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(revived, RMSPropTF)
    assert revived.get_config() == config


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"weight_decay": 1e-5}, "weight_decay_l2"),
        ({"rho": 1.5}, "rho=1.5"),
        ({"momentum": -0.1}, "momentum=-0.1"),
        ({"epsilon": -1.0}, "epsilon=-1.0"),
        ({"weight_decay_l2": -1e-5}, "weight_decay_l2=-1e-05"),
        ({"weight_decay_exclude": ["[gamma"]}, "Invalid regex"),
    ],
)
def test_invalid_arguments_raise_with_received_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RMSPropTF(**kwargs)
