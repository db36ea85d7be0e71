"""ProxyNormActivation against closed-form and quadrature references of the proxy statistics."""

import keras
import numpy as np
import pytest
from scipy import integrate, stats

from keras_efficientnet.layers import ProxyNormActivation, normal_quantiles
from tests.helpers import assert_config_round_trip

# (gamma, beta, proxy_beta, proxy_gamma) per channel.
PARAMS = np.array([
    [1.0, 0.0, 0.0, 0.0],
    [0.5, 0.3, -0.2, 0.4],
    [2.0, -1.0, 0.5, -0.3],
    [1.3, 0.7, 1.1, 0.9],
], dtype="float32")


def _layer(activation, epsilon=0.03, num_samples=200):
    layer = ProxyNormActivation(activation, num_samples=num_samples, epsilon=epsilon)
    layer.build((None, len(PARAMS)))
    for i, weight in enumerate((layer.gamma, layer.beta, layer.proxy_beta, layer.proxy_gamma)):
        weight.assign(PARAMS[:, i])
    return layer


def _swish(x):
    return x / (1.0 + np.exp(-x))


def _relu_moments(gamma, beta, proxy_beta, proxy_gamma):
    """Closed form for X = gamma * Y + beta with Y ~ N(proxy_beta, (1 + proxy_gamma)^2)."""
    m = gamma * proxy_beta + beta
    s = abs(gamma * (1 + proxy_gamma))
    a = m / s
    mean = m * stats.norm.cdf(a) + s * stats.norm.pdf(a)
    second = (m * m + s * s) * stats.norm.cdf(a) + m * s * stats.norm.pdf(a)
    return mean, second - mean * mean


def _quadrature_moments(fn, gamma, beta, proxy_beta, proxy_gamma):
    """E[f] and Var[f] of f = act(gamma * Y + beta) by adaptive quadrature over the Gaussian."""
    sd = 1 + proxy_gamma

    def moment(k):
        integrand = lambda y: fn(gamma * y + beta) ** k * stats.norm.pdf(y, proxy_beta, sd)
        return integrate.quad(integrand, proxy_beta - 12 * sd, proxy_beta + 12 * sd)[0]

    mean = moment(1)
    return mean, moment(2) - mean * mean


def test_quantiles_are_the_normal_ppf_grid():
    expected = stats.norm.ppf((np.arange(200) + 0.5) / 200)
    np.testing.assert_allclose(normal_quantiles(200), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ["swish", "relu", "linear"])
def test_matches_numpy_with_the_quantile_proxy(activation):
    fn = {"swish": _swish, "relu": lambda v: np.maximum(v, 0), "linear": lambda v: v}[activation]
    layer = _layer(activation)
    y = np.random.default_rng(0).standard_normal((3, 5, len(PARAMS))).astype("float32")
    gamma, beta, proxy_beta, proxy_gamma = (PARAMS[:, i].astype("float64") for i in range(4))
    u = stats.norm.ppf((np.arange(200) + 0.5) / 200)[:, None]
    proxy = fn(gamma * (proxy_beta + (1 + proxy_gamma) * u) + beta)
    expected = (fn(gamma * y + beta) - proxy.mean(0)) / np.sqrt(proxy.var(0) + 0.03)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(y)), expected,
                               rtol=2e-5, atol=2e-5)


def test_relu_statistics_match_the_closed_form():
    mean, variance = (keras.ops.convert_to_numpy(v) for v in _layer("relu").proxy_moments())
    for c, row in enumerate(PARAMS.astype("float64")):
        ref_mean, ref_var = _relu_moments(*row)
        # 200 quantiles approximate the Gaussian integral to well under 1% here.
        assert mean[c] == pytest.approx(ref_mean, rel=5e-3, abs=1e-3)
        assert variance[c] == pytest.approx(ref_var, rel=1e-2, abs=1e-3)


def test_swish_statistics_match_quadrature():
    mean, variance = (keras.ops.convert_to_numpy(v) for v in _layer("swish").proxy_moments())
    for c, row in enumerate(PARAMS.astype("float64")):
        ref_mean, ref_var = _quadrature_moments(_swish, *row)
        assert mean[c] == pytest.approx(ref_mean, rel=5e-3, abs=1e-3)
        assert variance[c] == pytest.approx(ref_var, rel=1e-2, abs=1e-3)


def test_linear_activation_reduces_to_an_affine_normalization():
    # act = identity: mu = gamma * proxy_beta + beta and var = gamma^2 (1 + proxy_gamma)^2 var(u).
    layer = _layer("linear", epsilon=0.0)
    mean, variance = (keras.ops.convert_to_numpy(v) for v in layer.proxy_moments())
    gamma, beta, proxy_beta, proxy_gamma = (PARAMS[:, i].astype("float64") for i in range(4))
    var_u = np.var(stats.norm.ppf((np.arange(200) + 0.5) / 200))
    np.testing.assert_allclose(mean, gamma * proxy_beta + beta, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(variance, (gamma * (1 + proxy_gamma)) ** 2 * var_u, rtol=1e-5)


def test_at_initialisation_a_standard_normal_input_leaves_normalized():
    layer = ProxyNormActivation("swish")
    y = np.random.default_rng(1).standard_normal((200_000, 3)).astype("float32")
    out = keras.ops.convert_to_numpy(layer(y))
    # With U ~ N(0, 1) and y ~ N(0, 1), the output has mean 0 and variance var / (var + eps).
    _, var = _quadrature_moments(_swish, 1.0, 0.0, 0.0, 0.0)
    np.testing.assert_allclose(out.mean(0), 0.0, atol=0.01)
    np.testing.assert_allclose(out.var(0), var / (var + 0.03), rtol=0.02)


def test_gradients_flow_through_the_proxy_statistics():
    # The output depends on proxy_beta only through the statistics: its gradient is non-zero
    # and matches a central finite difference.
    if keras.backend.backend() not in ("tensorflow", "jax"):
        pytest.skip("gradient check written for tensorflow and jax")
    layer = _layer("swish")
    y = np.random.default_rng(2).standard_normal((4, len(PARAMS))).astype("float32")
    weights = [w.value for w in layer.trainable_weights]

    def loss_of(values):
        out, _ = layer.stateless_call(values, [], y)
        return keras.ops.sum(out * out)

    if keras.backend.backend() == "jax":
        import jax

        grads = jax.grad(loss_of)(weights)
    else:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            variables = [tf.Variable(w) for w in weights]
            loss = loss_of(variables)
        grads = tape.gradient(loss, variables)
    index = [w.name for w in layer.trainable_weights].index("proxy_beta")
    grad = keras.ops.convert_to_numpy(grads[index])
    step = 1e-2
    for c in range(len(PARAMS)):
        values = [keras.ops.convert_to_numpy(w).astype("float64") for w in weights]
        up, down = [v.copy() for v in values], [v.copy() for v in values]
        up[index][c] += step
        down[index][c] -= step
        numeric = (float(loss_of([v.astype("float32") for v in up]))
                   - float(loss_of([v.astype("float32") for v in down]))) / (2 * step)
        assert abs(grad[c]) > 1e-3
        assert grad[c] == pytest.approx(numeric, rel=2e-2, abs=2e-3)


def test_output_does_not_depend_on_the_batch():
    layer = _layer("swish")
    y = np.random.default_rng(3).standard_normal((6, 2, 2, len(PARAMS))).astype("float32")
    whole = keras.ops.convert_to_numpy(layer(y))
    single = np.concatenate([keras.ops.convert_to_numpy(layer(y[i:i + 1])) for i in range(6)])
    np.testing.assert_allclose(whole, single, rtol=1e-6, atol=1e-6)


def test_mixed_precision_keeps_statistics_in_float32():
    layer = ProxyNormActivation("swish", dtype="mixed_float16")
    out = layer(np.ones((2, 4), "float32"))
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    assert layer.gamma.dtype == "float32"
    mean, variance = layer.proxy_moments()
    assert keras.backend.standardize_dtype(mean.dtype) == "float32"


@pytest.mark.parametrize("kwargs,match", [(dict(num_samples=1), "num_samples"),
                                          (dict(epsilon=-1.0), "epsilon")])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProxyNormActivation(**kwargs)


def test_config_round_trip():
    assert_config_round_trip(ProxyNormActivation("relu", num_samples=64, epsilon=0.01))


def test_unscaled_output_and_inverse_std_recompose_the_scaled_output():
    scaled = _layer("swish")
    unscaled = ProxyNormActivation("swish", scale_output=False)
    unscaled.build((None, len(PARAMS)))
    unscaled.set_weights(scaled.get_weights())
    y = np.random.default_rng(1).standard_normal((2, 3, len(PARAMS))).astype("float32")
    _, variance = (keras.ops.convert_to_numpy(v) for v in scaled.proxy_moments())
    inv_std = keras.ops.convert_to_numpy(unscaled.inverse_std())
    np.testing.assert_allclose(inv_std, 1 / np.sqrt(variance + 0.03), rtol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(unscaled(y)) * inv_std,
                               keras.ops.convert_to_numpy(scaled(y)), rtol=1e-5, atol=1e-6)
    assert_config_round_trip(unscaled)
    with pytest.raises(ValueError, match="scale_output must be a bool, received 'no'"):
        ProxyNormActivation(scale_output="no")
