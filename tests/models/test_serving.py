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


# G1-BN, G16-GN and G16-LN+PN in the default suite; G1-GN and G16-GN+PN (the same code paths)
# behind `slow`.
@pytest.mark.parametrize("family", [
    pytest.param(family, marks=[pytest.mark.slow] if family in ("g1-gn", "g16-gnpn") else [])
    for family in FAMILIES])
def test_fused_inference_equals_keras_layers(family):
    model = perturbed_model(family, classifier_activation=None)
    # Random images, and flat ones: a near-constant feature map is where statistics computed
    # as E[x^2] - E[x]^2 would lose their digits.
    x = np.concatenate([images(), np.full((1, 32, 32, 3), 255, "uint8"),
                        np.zeros((1, 32, 32, 3), "uint8")])
    expected = keras.ops.convert_to_numpy(model(x, fused=False))  # Keras' layers one by one
    assert expected.shape == (5, 10)
    assert np.abs(expected).max() > 1e-3  # not a trivially zero output
    for portable in (False, True):
        close_to(keras.ops.convert_to_numpy(model.fused_call(x, portable=portable)), expected)
    model.fused_inference = "on"
    close_to(model.predict_on_batch(x), expected)
    close_to(model.predict(x, batch_size=2, verbose=0), expected)
    fast = serving.serving_model(model)
    assert isinstance(fast, serving.ServingModel)
    close_to(fast.predict_on_batch(x), expected)


@pytest.fixture(scope="module")
def lnpn():
    """The perturbed tiny G16-LN+PN with a softmax classifier (as exported), shared: its
    predict function is traced once for the tests below (which leave its setting at auto)."""
    return perturbed_model("g16-lnpn")


def test_fused_probabilities_equal_keras_layers_to_1e_5(lnpn):
    x = images()
    np.testing.assert_allclose(lnpn.predict_on_batch(x),
                               keras.ops.convert_to_numpy(lnpn(x, fused=False)),
                               rtol=0, atol=1e-5)


@pytest.mark.slow  # export_saved_model's test below exports through it with a uint8 signature
def test_exported_saved_model_serves_the_fused_pass(tmp_path, lnpn):
    import tensorflow as tf

    model = lnpn
    x = images()
    serving.serving_model(model).export(str(tmp_path / "saved"), verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    signature = loaded.signatures["serving_default"]
    dtype = model.inputs[0].dtype  # the exported signature takes the model's input dtype
    (output,) = signature(images=tf.constant(x.astype(dtype))).values()
    close_to(output.numpy(), keras.ops.convert_to_numpy(model(x, fused=False)))


def test_fusion_refuses_mixed_precision_models_and_models_without_a_fused_form():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = ke.EfficientNet.from_preset("efficientnet-tiny-g16-lnpn",
                                            input_shape=(32, 32, 3), classes=10)
    finally:
        keras.config.set_dtype_policy(previous)
    assert not mixed.fuses()  # "auto" keeps Keras' layers
    with pytest.raises(ValueError, match="computes in bfloat16; fuse a float32 copy"):
        serving.serving_model(mixed)
    with pytest.raises(ValueError, match="computes in bfloat16; fuse a float32 copy"):
        mixed.fused_inference = "on"
    assert mixed.fused_inference == "auto"  # a refused value leaves the setting
    inputs = keras.Input((4,))
    branching = keras.Model(inputs, keras.layers.Add()([keras.layers.Dense(4)(inputs), inputs]))
    with pytest.raises(ValueError, match="has no fused inference form"):
        serving.serving_model(branching)
    assert serving.for_inference(branching) is branching
    with pytest.raises(ValueError, match="fused_inference='fast': valid values are auto, on"):
        ke.EfficientNet.from_preset("efficientnet-tiny-g1-bn", input_shape=(32, 32, 3),
                                    classes=10).fused_inference = "fast"


# The package's inference paths (issue 23 point 2; issue 34 point 3): the model's setting
# chooses for `model(x)`, `predict` and `predict_on_batch` alike; `for_inference` and the
# export take an explicit choice.

@pytest.fixture
def fused_calls(monkeypatch):
    """A list that grows each time the fused pass is traced or run eagerly
    (`EfficientNet.fused_call`)."""
    from keras_efficientnet.models.efficientnet import EfficientNet

    calls = []
    original = EfficientNet.fused_call

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(EfficientNet, "fused_call", counting)
    return calls


def test_for_inference_fuses_the_group_norm_models_only(lnpn):
    bn = ke.EfficientNet.from_preset("efficientnet-tiny-g1-bn", input_shape=(32, 32, 3),
                                     classes=10)
    assert lnpn.fuses() and not bn.fuses()  # BatchNorm folds into the convs already
    assert serving.for_inference(lnpn) is lnpn  # the model's own setting agrees
    off = serving.for_inference(lnpn, "off")
    assert isinstance(off, serving.ServingModel) and not off.fused
    assert serving.for_inference(bn) is bn
    on = serving.for_inference(bn, "on")
    assert isinstance(on, serving.ServingModel) and on.fused
    assert lnpn.fused_inference == bn.fused_inference == "auto"  # settings left alone
    with pytest.raises(ValueError, match="serving='fast': valid values are auto, on, off"):
        serving.for_inference(lnpn, "fast")


def test_predict_predict_on_batch_and_calls_follow_the_one_setting(fused_calls):
    model = perturbed_model("g16-lnpn", classifier_activation=None)  # its own: it is set
    weights, config = len(model.weights), model.get_config()
    trainable = list(model.trainable_weights)
    x = images(5)
    expected = keras.ops.convert_to_numpy(model(x, fused=False))
    assert not fused_calls
    for run in (lambda: model.predict(x, batch_size=2, verbose=0),
                lambda: model.predict_on_batch(x),
                lambda: model(x, training=False), lambda: model(x)):
        model.fused_inference = "auto"  # drops the traced functions: each path traces anew
        traced = len(fused_calls)
        close_to(keras.ops.convert_to_numpy(run()), expected)
        assert len(fused_calls) > traced  # "auto" fuses this model, in every path
    traced = len(fused_calls)
    model.predict(x, verbose=0)
    assert len(fused_calls) == traced  # the traced predict function is reused
    model.fused_inference = "off"  # the traced functions are dropped and traced again
    for run in (lambda: model.predict(x, verbose=0), lambda: model.predict_on_batch(x),
                lambda: model(x, training=False)):
        close_to(keras.ops.convert_to_numpy(run()), expected)
    assert len(fused_calls) == traced
    model.fused_inference = "auto"
    close_to(model.predict_on_batch(x), expected)
    assert len(fused_calls) > traced
    # Training never fuses.
    traced = len(fused_calls)
    model(x, training=True)
    assert len(fused_calls) == traced
    # The setting is not part of the model and leaves it as it was (trainable).
    assert len(model.weights) == weights and model.get_config() == config
    assert model.trainable and len(model.trainable_weights) == len(trainable)


def test_the_deprecated_predict_serving_argument_still_chooses(fused_calls, lnpn):
    x = images()
    expected = keras.ops.convert_to_numpy(lnpn(x, fused=False))
    traced = len(fused_calls)
    with pytest.warns(DeprecationWarning, match="set model.fused_inference = 'off'"):
        close_to(lnpn.predict(x, verbose=0, serving="off"), expected)
    assert len(fused_calls) == traced and lnpn.fused_inference == "auto"
    with pytest.raises(ValueError, match="valid values are auto, on, off"), \
            pytest.warns(DeprecationWarning):
        lnpn.predict(x, verbose=0, serving="yes")


def test_export_dir_saved_model_is_the_fused_pass_and_equals_the_model(tmp_path, lnpn):
    import json

    import tensorflow as tf

    from keras_efficientnet.training.export import export_saved_model
    from keras_efficientnet.training.run_dir import EXPORT_MARK

    model = lnpn
    x = images()
    expected = keras.ops.convert_to_numpy(model(x, fused=False))
    path = export_saved_model(model, tmp_path / "saved")
    assert json.loads((path / EXPORT_MARK).read_text())["forward_pass"] == "fused"
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    assert signature.structured_input_signature[1]["images"].dtype == tf.uint8
    close_to(signature(images=tf.constant(x))["output_0"].numpy(), expected)


@pytest.mark.slow
def test_the_fused_saved_model_converts_to_tflite_and_the_opt_out_exports_keras_layers(
        tmp_path, lnpn):
    """TFLite's converter has no EuclideanNorm: the export traces with `portable=True`."""
    import json

    import tensorflow as tf

    from keras_efficientnet.training.export import export_saved_model
    from keras_efficientnet.training.run_dir import EXPORT_MARK

    model = lnpn
    x = images()
    off = export_saved_model(model, tmp_path / "off", serving="off")
    assert json.loads((off / EXPORT_MARK).read_text())["forward_pass"] == "keras"
    signature = tf.saved_model.load(str(off)).signatures["serving_default"]
    keras_layers = keras.ops.convert_to_numpy(model(x, fused=False))
    close_to(signature(images=tf.constant(x))["output_0"].numpy(), keras_layers)
    path = export_saved_model(model, tmp_path / "saved")
    interpreter = tf.lite.Interpreter(
        model_content=tf.lite.TFLiteConverter.from_saved_model(str(path)).convert())
    (inputs,), (outputs,) = interpreter.get_input_details(), interpreter.get_output_details()
    interpreter.resize_tensor_input(inputs["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(inputs["index"], x)
    interpreter.invoke()
    close_to(interpreter.get_tensor(outputs["index"]), keras_layers)


def test_predict_command_and_api_take_the_fused_pass(tmp_path, fused_calls, capsys, lnpn):
    import json

    import tensorflow as tf
    from PIL import Image

    from keras_efficientnet.cli import predict
    from keras_efficientnet.datasets.preprocessing import center_crop

    model = lnpn
    model.save(tmp_path / "model.keras")
    paths = []
    for i, image in enumerate(images(3, resolution=40)):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(image).save(paths[-1])
    crops = np.stack([center_crop(tf.io.read_file(str(p)), 32).numpy() for p in paths])
    expected = keras.ops.convert_to_numpy(model(crops, fused=False))
    assert np.ptp(expected, axis=0).max() > 0.01  # the images score apart
    for mode in ("auto", "off"):
        traced = len(fused_calls)
        out = tmp_path / f"{mode}.jsonl"
        assert predict.main(["predict", f"--model_file={tmp_path / 'model.keras'}",
                             *map(str, paths), f"--serving={mode}", "--top_k=10",
                             "--runtime=tensorflow", f"--output={out}"]) == 0
        assert (len(fused_calls) > traced) == (mode == "auto")
        for record, row in zip(map(json.loads, out.read_text().splitlines()), expected):
            got = {top["index"]: top["probability"] for top in record["top_k"]}
            close_to(np.array([got[i] for i in range(10)]), row)
    traced = len(fused_calls)
    close_to(predict.predict(model, paths, 32), expected)
    assert len(fused_calls) > traced
    capsys.readouterr()
    assert predict.main(["predict", f"--model_file={tmp_path / 'model.keras'}", str(paths[0]),
                         "--serving=fast"]) == 2
    assert "--serving" in capsys.readouterr().err


def test_under_xla_auto_keeps_keras_layers_and_on_fuses_with_portable_ops(fused_calls):
    """XLA (`jit_compile=True`, Keras' default on a GPU) has no EuclideanNorm: "auto" leaves
    the fusing to XLA, and "on" compiles the fused pass with the portable statistics."""
    model = perturbed_model("g16-lnpn", classifier_activation=None)
    x = images()
    expected = keras.ops.convert_to_numpy(model(x, fused=False))
    model.compile(jit_compile=True)
    assert not model.fuses()
    model.fused_inference = "on"
    close_to(model.predict_on_batch(x), expected)
    assert fused_calls
