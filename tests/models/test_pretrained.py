"""keras.applications' EfficientNet weights in the G1-BN presets, against keras.applications itself.

No network: the files are written from keras.applications models with randomized weights, in the
layout of keras.applications' own `.h5` files (tests/models/keras_applications_h5.py).
"""

import logging

import keras
import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet.models import pretrained
from tests.models.keras_applications_h5 import (
    randomized_keras_applications,
    write_keras_applications_h5,
)

# keras.applications models are full-size B0s: seconds under TensorFlow, minutes under JAX on a
# CPU (eager dispatch); the loader itself is NumPy and h5py, the same on every backend.
pytestmark = pytest.mark.jax_cpu_slow

SIZE = 64


def _np(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture(scope="module")
def b0(tmp_path_factory):
    """A randomized keras.applications B0 (logits out) and its files with and without the top."""
    reference = randomized_keras_applications("b0", input_shape=(SIZE, SIZE, 3),
                                              classifier_activation=None)
    folder = tmp_path_factory.mktemp("weights")
    top = write_keras_applications_h5(reference, folder / "efficientnetb0.h5")
    notop = write_keras_applications_h5(reference, folder / "efficientnetb0_notop.h5",
                                        include_top=False)
    images = np.random.default_rng(0).integers(0, 256, (2, SIZE, SIZE, 3)).astype("uint8")
    outputs = keras.Model(reference.input, {"logits": reference.output,
                                            "pooled": reference.get_layer("avg_pool").output})
    expected, floor = _reference_and_float32_floor(outputs, images)
    return dict(reference=reference, top=top, notop=notop, images=images, floor=floor,
                **expected)


def _relative_error(ours, reference):
    return np.abs(ours - reference).max() / np.abs(reference).max()


# Our models and keras.applications order their float32 operations differently (the input
# normalization alone is written another way), so they can agree only as closely as float32 lets
# a deep net agree with itself. That floor is measured, not guessed: the reference's own largest
# relative change when every input pixel moves by one float32 ulp. Correct loads measured 0.7x to
# 1.8x of it on TensorFlow and JAX; a weight loaded into the wrong place gives errors of order 1.
FLOOR_MULTIPLE = 10


def _reference_and_float32_floor(reference, images, draws=2):
    """`reference`'s outputs (a dict of arrays) on `images`, and per output its float32 floor."""
    def run(x):
        return {k: _np(v) for k, v in reference(x).items()}

    x = images.astype("float32")
    expected, floor = run(x), {}
    rng = np.random.default_rng(1)
    for _ in range(draws):
        toward = np.where(rng.random(x.shape) < 0.5, np.inf, -np.inf).astype("float32")
        moved = np.nextafter(x, toward)  # float32 both: one float32 ulp up or down
        assert moved.dtype == np.float32 and (moved != x).all()
        for key, value in run(moved).items():
            floor[key] = max(floor.get(key, 0.0), _relative_error(value, expected[key]))
    # Above 1e-3 the reference is too ill-conditioned for the comparison to mean anything.
    assert max(floor.values()) < 1e-3, floor
    return expected, {k: max(v, float(np.finfo("float32").eps)) for k, v in floor.items()}


def _assert_depends_on_the_image(logits):
    """Two images' logits differ by a tenth of their size: the comparison sees the whole net."""
    spread = logits.std(axis=0).mean() / np.abs(logits).mean()
    assert spread > 0.1, spread  # measured 0.2 to 0.9


def _assert_agrees(ours, expected, floor, key):
    error = _relative_error(ours, expected[key])
    assert error < FLOOR_MULTIPLE * floor[key], (
        f"{key}: relative error {error:.2e} is {error / floor[key]:.1f}x the float32 floor")


@pytest.fixture
def fetched(b0, monkeypatch):
    """`weights="imagenet"` offline: Keras' download function hands out the randomized files."""
    calls = []

    def get_file(fname, origin, cache_dir, cache_subdir, file_hash):
        assert cache_dir == pretrained.keras_cache_dir()
        calls.append((fname, origin, cache_subdir, file_hash))
        return str(b0["notop"] if fname.endswith("_notop.h5") else b0["top"])

    monkeypatch.setattr(keras.utils, "get_file", get_file)
    return calls


def _call(name, md5):
    return (name, f"https://storage.googleapis.com/keras-applications/{name}", "models", md5)


def test_imagenet_g1_bn_computes_keras_applications_function(b0, fetched):
    model = ke.EfficientNet.from_preset("efficientnet-b0-g1-bn", weights="imagenet",
                                        input_shape=(SIZE, SIZE, 3), classifier_activation=None)
    assert fetched == [_call("efficientnetb0.h5", "902e53a9f72be733fc0bcb005b3ebbac")]
    # 311 variables: keras.applications' 314 less its input normalization's mean, variance, count.
    assert len(model.weights) == 311 == len(b0["reference"].weights) - 3
    _assert_depends_on_the_image(b0["logits"])
    _assert_agrees(_np(model(b0["images"])), b0, b0["floor"], "logits")


def test_imagenet_without_the_top_loads_the_notop_file(b0, fetched):
    model = ke.EfficientNet("b0", include_top=False, pooling="avg", weights="imagenet",
                            input_shape=(SIZE, SIZE, 3))
    assert fetched == [_call("efficientnetb0_notop.h5", "50bc09e76180e00e4465e1a485ddc09d")]
    _assert_agrees(_np(model(b0["images"])), b0, b0["floor"], "pooled")


def test_other_classes_load_the_backbone_and_keep_a_new_head(b0, fetched, caplog):
    with caplog.at_level(logging.INFO, logger="keras_efficientnet"):
        model = ke.EfficientNet("b0", classes=10, input_shape=(SIZE, SIZE, 3),
                                weights="imagenet")
    assert fetched == [_call("efficientnetb0_notop.h5", "50bc09e76180e00e4465e1a485ddc09d")]
    assert "10-class classifier is newly initialized (the file has no classifier)" in caplog.text
    pooled = keras.Model(model.input, model.get_layer("avg_pool").output)
    _assert_agrees(_np(pooled(b0["images"])), b0, b0["floor"], "pooled")
    assert model.get_layer("predictions").kernel.shape == (1280, 10)


def test_a_path_with_another_classifier_gives_keras_applications_feature_maps(b0, caplog):
    with caplog.at_level(logging.INFO, logger="keras_efficientnet"):
        backbone = ke.EfficientNet("b0", classes=10, weights=b0["top"],
                                   input_shape=(None, None, 3))
    assert "10-class classifier is newly initialized (the file's has 1000 classes)" in caplog.text
    features = backbone.feature_maps()(b0["images"])
    reference = b0["reference"]
    ends = {"P2": "block2b_add", "P3": "block3b_add", "P4": "block5c_add",
            "P5": "block7a_project_bn"}
    expected, floor = _reference_and_float32_floor(
        keras.Model(reference.input, {k: reference.get_layer(v).output for k, v in ends.items()}),
        b0["images"])
    assert sorted(features) == sorted(ends)
    for key in ends:
        _assert_agrees(_np(features[key]), expected, floor, key)


def test_url_and_hashes_are_keras_applications_own():
    source = pytest.importorskip("keras.src.applications.efficientnet")
    assert pretrained.WEIGHTS_URL == source.BASE_WEIGHTS_PATH
    assert pretrained.WEIGHTS_HASHES == {k: tuple(v) for k, v in source.WEIGHTS_HASHES.items()}


def test_a_file_of_another_variant_fails_naming_what_fits(b0):
    with pytest.raises(ValueError, match=r"do not fit efficientnet-b1-g1-bn .*the file holds "
                                         r"keras.applications' EfficientNetB0, which fits "
                                         r"efficientnet-b0-g1-bn"):
        ke.EfficientNet.from_preset("efficientnet-b1-g1-bn", weights=b0["top"],
                                    input_shape=(SIZE, SIZE, 3))


@pytest.mark.parametrize("preset,shown", [
    ("efficientnet-b0-g16-gn", r"efficientnet-b0-g16-gn \(group_size=16, expand_ratio=4, "
                               r"norm='group', input_normalization='mean'\)"),
    ("efficientnet-b0-g1-gn", r"efficientnet-b0-g1-gn \(norm='group', "
                              r"input_normalization='mean'\)"),
    ("efficientnet-b2-g16-lnpn", r"efficientnet-b2-g16-lnpn \(.*proxy_norm=True, "
                                 r"input_normalization='mean'\)"),
])
def test_weights_on_another_architecture_fail_before_building(b0, preset, shown):
    fits = preset.split("-")[1]
    with pytest.raises(ValueError, match=shown + f".*Fitting preset: efficientnet-{fits}-g1-bn"):
        ke.EfficientNet.from_preset(preset, weights=str(b0["top"]))


@pytest.mark.parametrize("weights,match", [
    ("imagenet21k", "neither 'imagenet' nor a .h5 file"),
    ("missing.h5", "weights='missing.h5': no such file"),
    (3, "weights must be None, 'imagenet' or the path"),
])
def test_bad_weights_values_fail_with_a_clear_message(weights, match):
    with pytest.raises(ValueError, match=match):
        ke.EfficientNet("b0", weights=weights)


def test_tiny_has_no_weights():
    with pytest.raises(ValueError, match=r"variant='tiny'.*efficientnet-b0-g1-bn, "
                                         r"efficientnet-b1-g1-bn"):
        ke.EfficientNet("tiny", weights="imagenet")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["b1", "b2", "b3", "b4", "b5", "b6", "b7"])
def test_every_variant_loads_keras_applications_layout(tmp_path, variant):
    reference = randomized_keras_applications(variant, input_shape=(SIZE, SIZE, 3),
                                              classifier_activation=None)
    path = write_keras_applications_h5(reference, tmp_path / f"efficientnet{variant}.h5")
    model = ke.EfficientNet.from_preset(f"efficientnet-{variant}-g1-bn", weights=path,
                                        input_shape=(SIZE, SIZE, 3), classifier_activation=None)
    images = np.random.default_rng(0).integers(0, 256, (2, SIZE, SIZE, 3)).astype("uint8")
    last_of_stage5 = [b for b in model.block_names if b.startswith("block5")][-1]
    ours = keras.Model(model.input, [model.get_layer(last_of_stage5).output, model.output])
    expected, floor = _reference_and_float32_floor(
        keras.Model(reference.input, {"stage5": reference.get_layer(f"{last_of_stage5}_add").output,
                                      "logits": reference.output}), images)
    features, logits = [_np(t) for t in ours(images)]
    _assert_depends_on_the_image(expected["logits"])
    _assert_agrees(features, expected, floor, "stage5")
    _assert_agrees(logits, expected, floor, "logits")


def _md5(path) -> str:
    import hashlib

    return hashlib.md5(path.read_bytes()).hexdigest()


def test_offline_imagenet_is_one_line_saying_where_the_file_goes_and_that_place_works(
        b0, tmp_path, monkeypatch):
    from keras_efficientnet.cli import errors

    # Nothing listens on port 9 of this host: Keras' real download fails as it does offline.
    monkeypatch.setattr(pretrained, "WEIGHTS_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    (tmp_path / "keras").mkdir()
    place = tmp_path / "keras" / "models" / "efficientnetb0_notop.h5"
    with pytest.raises(pretrained.WeightsDownloadError) as caught:
        ke.EfficientNet.from_preset("efficientnet-b0-g1-bn", weights="imagenet", classes=3,
                                    input_shape=(SIZE, SIZE, 3))
    message = str(caught.value)
    assert "\n" not in message and "URL fetch failure" in message
    assert f"put that file at {place} (from http://127.0.0.1:9/efficientnetb0_notop.h5)" in message
    assert errors.describe(caught.value) == (f"error: {message}", errors.BAD_INPUT)
    # Put there (the hash made to fit the randomized file), it loads with no network.
    place.write_bytes(b0["notop"].read_bytes())
    monkeypatch.setitem(pretrained.WEIGHTS_HASHES, "b0", ("unused", _md5(place)))
    model = ke.EfficientNet.from_preset("efficientnet-b0-g1-bn", weights="imagenet",
                                        include_top=False, pooling="avg",
                                        input_shape=(SIZE, SIZE, 3))
    _assert_agrees(_np(model(b0["images"])), b0, b0["floor"], "pooled")
