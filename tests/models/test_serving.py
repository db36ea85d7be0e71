"""The fused serving forward pass (keras_efficientnet.serving) against the Keras model itself."""

import keras
import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet import serving

pytestmark = pytest.mark.tf_only

FAMILIES = ("g1-bn", "g1-gn", "g16-gn", "g16-gnpn", "g16-lnpn")


def perturbed_model(family: str, resolution: int = 32, **overrides) -> keras.Model:
    """A tiny preset whose norm affines and proxy parameters are moved off their initial values
    (ones and zeros would hide a gamma or beta used in the wrong place)."""
    model = ke.EfficientNet.from_preset(f"efficientnet-tiny-{family}",
                                        input_shape=(resolution, resolution, 3), classes=10,
                                        **overrides)
    rng = np.random.default_rng(7)
    for weight in model.weights:
        if any(key in weight.path for key in ("gamma", "beta", "proxy", "moving")):
            noise = 0.2 * rng.standard_normal(weight.shape).astype("float32")
            value = weight.numpy() + noise
            weight.assign(np.abs(value) if "variance" in weight.path else value)
    return model


def images(batch: int = 3, resolution: int = 32) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (batch, resolution, resolution, 3)).astype(
        "uint8")


def close_to(actual, expected, tolerance=1e-5):
    """Equal to `tolerance` of the output's scale: float32 sums in another order differ by
    round-off that grows with the logits (about 1e-6 of them per layer)."""
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=tolerance * scale)


# The BN and LN+PN families in the default suite; the GroupNorm ones (same code path with
# groups > 1) behind `slow`.
@pytest.mark.parametrize("family", [
    pytest.param(family, marks=[pytest.mark.slow] if "gn" in family else [])
    for family in FAMILIES])
def test_serving_model_equals_the_model(family):
    model = perturbed_model(family, classifier_activation=None)
    # Random images, and flat ones: a near-constant feature map is where statistics computed
    # as E[x^2] - E[x]^2 would lose their digits.
    x = np.concatenate([images(), np.full((1, 32, 32, 3), 255, "uint8"),
                        np.zeros((1, 32, 32, 3), "uint8")])
    expected = model.predict_on_batch(x)
    fast = serving.serving_model(model)
    assert isinstance(fast, serving.ServingModel)
    actual = fast.predict_on_batch(x)
    assert actual.shape == expected.shape == (5, 10)
    assert np.abs(expected).max() > 1e-3  # not a trivially zero output
    close_to(actual, expected)
    close_to(fast.predict(x, batch_size=2, verbose=0), expected)


def test_serving_model_probabilities_equal_the_model_to_1e_5():
    model = perturbed_model("g16-lnpn")  # softmax classifier, as exported
    x = images()
    np.testing.assert_allclose(serving.serving_model(model).predict_on_batch(x),
                               model.predict_on_batch(x), rtol=0, atol=1e-5)


def test_fused_norm_matches_layer_norm_then_proxy_norm_by_hand():
    """LayerNorm over H, W, C, then Proxy Norm, written out in numpy from the paper's formula."""
    x = np.random.default_rng(1).standard_normal((2, 5, 5, 8)).astype("float32") * 3 + 1
    norm = keras.layers.GroupNormalization(1, epsilon=1e-3, center=False, scale=False)
    act = ke.layers.ProxyNormActivation("swish")
    norm.build(x.shape)
    act.build(x.shape)
    rng = np.random.default_rng(2)
    for weight in act.weights:
        weight.assign(rng.standard_normal(weight.shape).astype("float32") * 0.3)
    y, pending = serving.fused_norm(x, norm, act)
    y = serving.materialize(y, pending).numpy()

    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    variance = x.var(axis=(1, 2, 3), keepdims=True)
    normalized = (x - mean) / np.sqrt(variance + 1e-3)
    gamma, beta, proxy_beta, proxy_gamma = (w.numpy() for w in
                                            (act.gamma, act.beta, act.proxy_beta,
                                             act.proxy_gamma))

    def swish(v):
        return v / (1 + np.exp(-v))

    z = swish(gamma * normalized + beta)
    proxy = swish(gamma * (proxy_beta + (1 + proxy_gamma) * act._quantiles) + beta)
    expected = (z - proxy.mean(0)) / np.sqrt(proxy.var(0) + act.epsilon)
    np.testing.assert_allclose(y, expected, rtol=0, atol=2e-5)


def test_exported_saved_model_serves_the_fused_pass(tmp_path):
    import tensorflow as tf

    model = perturbed_model("g16-lnpn")
    x = images()
    serving.serving_model(model).export(str(tmp_path / "saved"), verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    signature = loaded.signatures["serving_default"]
    dtype = model.inputs[0].dtype  # the exported signature takes the model's input dtype
    (output,) = signature(images=tf.constant(x.astype(dtype))).values()
    close_to(output.numpy(), model.predict_on_batch(x))


def test_serving_model_refuses_mixed_precision_and_branching_models():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = ke.EfficientNet.from_preset("efficientnet-tiny-g16-lnpn",
                                            input_shape=(32, 32, 3), classes=10)
    finally:
        keras.config.set_dtype_policy(previous)
    with pytest.raises(ValueError, match="computes in bfloat16; serve a float32 copy"):
        serving.serving_model(mixed)
    inputs = keras.Input((4,))
    branching = keras.Model(inputs, keras.layers.Add()([keras.layers.Dense(4)(inputs), inputs]))
    with pytest.raises(ValueError, match="is not a chain of layers"):
        serving.serving_model(branching)
