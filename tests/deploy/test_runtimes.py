"""keras_efficientnet.deploy.runtimes: sessions on OpenVINO, ONNX Runtime and TensorFlow give
Keras' probabilities (to 1e-5 of the output scale), at the batch sizes a caller meets; bad input
and missing runtimes are one-line errors; the export cache beside a model file is keyed by its
content and written atomically."""

import importlib.util

import keras
import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet.deploy import runtimes

pytestmark = pytest.mark.tf_only

SIZE = 32
TOLERANCE = 1e-5  # of the output scale (the largest |probability|)


def _tiny(family: str, classes: int = 7) -> keras.Model:
    """A tiny model whose weights are perturbed (not BatchNorm's statistics), so that its
    probabilities differ from image to image and from uniform."""
    keras.utils.set_random_seed(0)
    model = ke.EfficientNet.from_preset(f"efficientnet-tiny-{family}",
                                        input_shape=(SIZE, SIZE, 3), classes=classes)
    rng = np.random.default_rng(1)
    for weight in model.weights:
        if "moving" not in weight.path:
            weight.assign(weight.numpy() + rng.normal(0, 0.1, weight.shape).astype("float32"))
    return model


def _needs(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed "
                              "(pip install -e \".[deploy]\")")


@pytest.fixture(scope="module", params=["g1-bn", "g16-lnpn"])
def exported(request, tmp_path_factory):
    """A tiny model of each family, its ONNX file, OpenVINO IR and SavedModel."""
    pytest.importorskip("onnx", reason="onnx not installed (pip install -e \".[deploy]\")")
    from keras_efficientnet.deploy import export_onnx, export_openvino
    from keras_efficientnet.serving import export_saved_model

    folder = tmp_path_factory.mktemp(request.param)
    model = _tiny(request.param)
    onnx = export_onnx(model, folder / "model.onnx")
    paths = {"onnxruntime": onnx, "tensorflow": folder / "saved_model"}
    export_saved_model(model, paths["tensorflow"])
    if importlib.util.find_spec("openvino"):
        paths["openvino"] = export_openvino(onnx, folder / "model.xml")
    return model, paths


def _images(count: int, seed: int = 0) -> np.ndarray:
    """Noise with each image's own colour level, so that the model scores them apart."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 64, (count, SIZE, SIZE, 3), dtype=np.uint8)
    for i in range(count):
        images[i, ..., (i + seed) % 3] += np.uint8(24 * (i + seed) % 192)
    return images


@pytest.mark.parametrize("runtime,hint", [("openvino", "LATENCY"), ("openvino", "THROUGHPUT"),
                                          ("onnxruntime", None), ("tensorflow", None)])
def test_a_session_gives_keras_probabilities_at_every_batch_size(exported, runtime, hint):
    model, paths = exported
    if runtime not in paths or not runtimes.installed(runtime):
        pytest.skip(f"{runtime} not installed (pip install -e \".[deploy]\")")
    session = runtimes.open_session(paths[runtime], runtime, **({"hint": hint} if hint else {}))
    assert session.input_shape == (None, SIZE, SIZE, 3)
    assert session.output_shape[-1] == 7
    # 5 then 1 then 5 again: OpenVINO compiles a model per batch size and must keep both; the
    # THROUGHPUT hint splits 5 images over its requests unevenly.
    for count, seed in ((5, 0), (1, 1), (5, 2)):
        images = _images(count, seed)
        expected = keras.ops.convert_to_numpy(model(images)).astype("float64")
        atol = TOLERANCE * np.abs(expected).max()
        # The images score apart by far more than the tolerance: a session that mixed them up
        # would fail.
        assert count == 1 or np.abs(expected - expected[::-1]).max() > 10 * atol
        got = session(images)
        assert got.dtype == np.float32 and got.shape == (count, 7)
        np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


@_needs("onnxruntime")
def test_a_session_refuses_images_it_cannot_take_in_one_line(exported):
    _, paths = exported
    session = runtimes.open_session(paths["onnxruntime"], "onnxruntime")
    with pytest.raises(ValueError, match=r"expected uint8 images \[batch, height, width, 3\], "
                                         r"received float32 \[2, 32, 32, 3\]"):
        session(_images(2).astype("float32"))
    with pytest.raises(ValueError, match="the model takes 32x32 images, received 16x16"):
        session(_images(2)[:, :16, :16])


def test_unknown_and_missing_runtimes_are_one_line_errors(exported, monkeypatch):
    _, paths = exported
    with pytest.raises(ValueError, match="unknown runtime 'tvm': choose one of openvino, "
                                         "onnxruntime, tensorflow"):
        runtimes.open_session(paths["onnxruntime"], "tvm")
    # A runtime whose module does not import: the error names the extra that installs it.
    monkeypatch.setitem(runtimes.MODULES, "onnxruntime", "no_such_module_for_a_test")
    runtimes._import_problem.cache_clear()
    try:
        assert "onnxruntime" not in runtimes.available_runtimes()
        with pytest.raises(runtimes.RuntimeMissing) as error:
            runtimes.open_session(paths["onnxruntime"], "onnxruntime")
        assert 'pip install "keras-efficientnet[deploy]"' in str(error.value)
        assert "\n" not in str(error.value)
    finally:
        monkeypatch.undo()
        runtimes._import_problem.cache_clear()


@_needs("onnxruntime")
def test_a_runtime_refuses_an_artifact_it_does_not_read(exported):
    _, paths = exported
    with pytest.raises(ValueError, match="the onnxruntime runtime reads a .onnx file"):
        runtimes.open_session(paths["tensorflow"], "onnxruntime")
    with pytest.raises(ValueError, match="not a SavedModel folder"):
        runtimes.open_session(paths["onnxruntime"], "tensorflow")


def test_available_runtimes_follow_autos_order():
    found = runtimes.available_runtimes()
    assert found == [r for r in runtimes.RUNTIMES
                     if importlib.util.find_spec(runtimes.MODULES[r]) is not None]
    assert found[-1] == "tensorflow"  # this suite runs with TensorFlow


# ------------------------------------------------------------------------------ export cache


def _builder(calls: list, text: str = "graph"):
    def build(folder):
        calls.append(folder)
        (folder / "model.bin").write_text("weights")
        (folder / "model.xml").write_text(text)
        return folder / "model.xml"
    return build


def test_the_cache_exports_once_per_content_and_replaces_a_changed_models(tmp_path):
    model_file = tmp_path / "model.keras"
    model_file.write_bytes(b"first contents")
    calls = []
    path, made = runtimes.cached_artifact(model_file, "openvino", _builder(calls))
    import hashlib

    digest = hashlib.sha256(b"first contents" + b"\0").hexdigest()
    assert (path, made) == (tmp_path / "model.keras.deploy" / digest / "model.xml", True)
    assert path.read_text() == "graph" and path.with_suffix(".bin").read_text() == "weights"
    assert runtimes.cached_artifact(model_file, "openvino", _builder(calls)) == (path, False)
    assert len(calls) == 1
    # Another exporter version is another entry; so is another content, which also removes
    # the entries of the earlier contents.
    other, made = runtimes.cached_artifact(model_file, "openvino", _builder(calls), version="2")
    assert made and other.parent != path.parent
    model_file.write_bytes(b"second contents")
    newer, made = runtimes.cached_artifact(model_file, "openvino", _builder(calls, "new"))
    assert made and newer.read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "model.keras.deploy").iterdir()) == [
        newer.parent.name]


def test_a_failed_export_leaves_no_entry_and_no_scratch(tmp_path):
    model_file = tmp_path / "model.keras"
    model_file.write_bytes(b"contents")

    def fails(folder):
        (folder / "model.bin").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        runtimes.cached_artifact(model_file, "openvino", fails)
    root = tmp_path / "model.keras.deploy"
    assert [p for p in root.rglob("*") if p.is_file()] == []
    assert [p.name for p in root.iterdir()] == []
    # An entry that lost its main file (a stop between the renames) is exported again.
    calls = []
    path, _ = runtimes.cached_artifact(model_file, "openvino", _builder(calls))
    path.unlink()
    assert runtimes.cached_artifact(model_file, "openvino", _builder(calls)) == (path, True)
    assert len(calls) == 2


def test_the_cache_refuses_a_link_for_its_folder(tmp_path):
    model_file = tmp_path / "model.keras"
    model_file.write_bytes(b"contents")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "model.keras.deploy").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="symbolic link"):
        runtimes.cached_artifact(model_file, "openvino", _builder([]))
    assert list((tmp_path / "elsewhere").iterdir()) == []
