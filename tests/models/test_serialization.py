"""Saving and loading models (safe mode) and config round trips of the models."""

import keras
import numpy as np
import pytest

import keras_efficientnet as ke


@pytest.mark.parametrize("kwargs", [
    dict(group_size=16, expand_ratio=4, norm="layer", proxy_norm=True),
    pytest.param(dict(norm="batch"), marks=pytest.mark.jax_cpu_slow),
])
def test_keras_file_round_trip_in_safe_mode(tmp_path, kwargs):
    model = ke.EfficientNet("tiny", classes=7, **kwargs)
    images = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3)).astype("uint8")
    # Move the weights off their initial values so a load that re-initialises would show.
    model.set_weights([w + 0.01 * np.random.default_rng(1).standard_normal(w.shape)
                       for w in model.get_weights()])
    expected = _outputs(model, images)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert type(loaded) is ke.EfficientNet
    assert loaded.get_config() == model.get_config()
    np.testing.assert_array_equal(_outputs(loaded, images), expected)


def _outputs(model, images) -> np.ndarray:
    """The model's inference outputs, both sides of a comparison taken the same way. JAX
    compiles each operation of an eager call on its own (12.6 CPU s for this model, cold), one
    jit-compiled forward pass once (2.4 s); TensorFlow runs an eager call at once and would
    trace a function for `predict_on_batch`."""
    if keras.backend.backend() == "jax":
        return model.predict_on_batch(images)
    return keras.ops.convert_to_numpy(model(images))


def test_model_config_round_trip():
    # The tiny variant with the G16-GN preset's arguments: the same config keys as B0's, built
    # in a fraction of the time (B0's build took 10 s under JAX).
    model = ke.EfficientNet.from_preset("efficientnet-tiny-g16-gn", input_shape=(None, None, 3),
                                        classes=3)
    clone = ke.EfficientNet.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    assert clone.count_params() == model.count_params()
