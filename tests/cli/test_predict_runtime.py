"""`keras-efficientnet-predict --runtime`: every runtime predicts TensorFlow's probabilities (to
1e-5 of the output scale), the export is made once into the cache beside the model file and
again for a changed model, auto times the installed runtimes once and takes the faster, and a
runtime that is unknown, missing or cannot serve the request is one line."""

import importlib.util
import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_efficientnet as ke
from keras_efficientnet.cli import predict
from keras_efficientnet.datasets.preprocessing import center_crop
from keras_efficientnet.deploy import runtimes

pytestmark = pytest.mark.tf_only

SIZE = 32
TOLERANCE = 1e-5  # of the output scale (the largest probability)
ROUNDING = 5e-7  # the output files' probabilities have 6 decimals


def _model(seed: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = ke.EfficientNet.from_preset("efficientnet-tiny-g16-lnpn", classes=5,
                                        input_shape=(SIZE, SIZE, 3))
    # The norms' and proxy norm's parameters and statistics moved off their initial values, so
    # that the images score apart (the kernels keep their initial scale, as training keeps
    # them near it).
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if any(key in weight.path for key in ("gamma", "beta", "proxy", "moving")):
            value = weight.numpy() + rng.normal(0, 0.3, weight.shape).astype("float32")
            weight.assign(np.abs(value) + 0.05 if "variance" in weight.path else value)
    return model


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for i in range(4):
        image = rng.integers(0, 64, (40, 36 + 4 * i, 3), dtype=np.uint8)
        image[..., i % 3] += np.uint8(48 * i)
        Image.fromarray(image).save(folder / f"{i}.png")
    return sorted(folder.glob("*.png"))


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """_model(1) saved once for the module (its build and save took a second or two a test)."""
    path = tmp_path_factory.mktemp("saved") / "model.keras"
    _model(1).save(path)
    return path


@pytest.fixture
def model_file(saved_model, tmp_path):
    """A copy of the saved model in this test's own folder: the export cache sits beside it."""
    path = tmp_path / "run" / "model.keras"
    path.parent.mkdir()
    shutil.copyfile(saved_model, path)
    return path


@pytest.fixture(scope="module")
def expected(saved_model, images):
    """Keras' probabilities of the saved model on the images' centre crops, computed once."""
    return _expected(saved_model, images)


def _expected(path, files) -> np.ndarray:
    model = keras.models.load_model(path)
    crops = np.stack([center_crop(tf.io.read_file(str(p)), SIZE).numpy() for p in files])
    return keras.ops.convert_to_numpy(model(crops)).astype("float64")


def _predicted(model_file, files, out, *options) -> np.ndarray:
    assert predict.main(["predict", f"--model_file={model_file}", *map(str, files),
                         "--top_k=5", f"--output={out}", *options]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["path"] for r in records] == [str(f) for f in files]
    table = np.zeros((len(records), 5))
    for row, record in enumerate(records):
        for top in record["top_k"]:
            table[row, top["index"]] = top["probability"]
    return table


def _skip_unless(runtime: str) -> None:
    if runtime != "auto" and not runtimes.installed(runtime):
        pytest.skip(f"{runtime} not installed (pip install -e \".[deploy]\")")


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime", "tensorflow", "auto"])
def test_every_runtime_predicts_tensorflows_probabilities(runtime, model_file, images,
                                                          expected, tmp_path):
    _skip_unless(runtime)
    # The images score apart by far more than the tolerance.
    assert np.abs(expected - expected[::-1]).max() > 100 * TOLERANCE
    got = _predicted(model_file, images, tmp_path / "p.jsonl", f"--runtime={runtime}",
                     "--batch_size=3")  # batches of 3 and 1
    np.testing.assert_allclose(got, expected, rtol=0,
                               atol=TOLERANCE * expected.max() + ROUNDING)
    cache = runtimes.cache_root(model_file)
    exported = [r for r in runtimes.RUNTIMES[:-1] if runtimes.installed(r)]
    chosen = [runtime] if runtime != "auto" else exported
    if chosen == ["tensorflow"] or not chosen:
        assert not cache.exists()
    else:
        [entry] = cache.iterdir()
        assert all((entry / runtimes.CACHED_NAMES[r]).is_file() for r in chosen)


def test_auto_times_both_export_runtimes_once_and_takes_the_faster(
        model_file, images, expected, tmp_path, capsys, monkeypatch):
    for runtime in ("openvino", "onnxruntime"):
        _skip_unless(runtime)
    opened = []
    open_session = runtimes.open_session
    monkeypatch.setattr(runtimes, "open_session",
                        lambda path, runtime, **kw: opened.append(runtime) or open_session(
                            path, runtime, **kw))
    got = _predicted(model_file, images, tmp_path / "p.jsonl", "--batch_size=3",
                     "--verbosity=1")
    np.testing.assert_allclose(got, expected, rtol=0,
                               atol=TOLERANCE * expected.max() + ROUNDING)
    # First run: both exports made, each opened and timed at the batch size, the rates kept.
    assert sorted(opened) == ["onnxruntime", "openvino"]
    [entry] = runtimes.cache_root(model_file).iterdir()
    record = json.loads((entry / runtimes.RATES_NAME).read_text())
    assert record["batch"] == 3
    rates = record["images_per_second"]
    assert sorted(rates) == ["onnxruntime", "openvino"] and min(rates.values()) > 0
    faster = max(rates, key=rates.get)
    assert f"--runtime=auto: {faster}, the fastest" in capsys.readouterr().err
    # Later runs read the record and open only the faster: a record that says the other way
    # round turns the choice, each way.
    for winner, loser in (("onnxruntime", "openvino"), ("openvino", "onnxruntime")):
        (entry / runtimes.RATES_NAME).write_text(json.dumps(
            {"batch": 3, "images_per_second": {winner: 20.0, loser: 10.0}}))
        opened.clear()
        got = _predicted(model_file, images, tmp_path / "p.jsonl", "--batch_size=3")
        assert opened == [winner]
        np.testing.assert_allclose(got, expected, rtol=0,
                                   atol=TOLERANCE * expected.max() + ROUNDING)
    # A record for another batch size is measured again (and replaced).
    opened.clear()
    _predicted(model_file, images, tmp_path / "p.jsonl", "--batch_size=2")
    assert sorted(opened) == ["onnxruntime", "openvino"]
    assert json.loads((entry / runtimes.RATES_NAME).read_text())["batch"] == 2


def test_the_rates_record_is_read_only_when_it_matches(tmp_path):
    assert runtimes.recorded_rates(tmp_path, ["openvino"], 8) is None  # no file
    runtimes.record_rates(tmp_path, {"openvino": 12.5, "onnxruntime": 30.0}, 8)
    assert runtimes.recorded_rates(tmp_path, ["onnxruntime", "openvino"], 8) == {
        "openvino": 12.5, "onnxruntime": 30.0}
    assert runtimes.recorded_rates(tmp_path, ["onnxruntime", "openvino"], 4) is None
    assert runtimes.recorded_rates(tmp_path, ["openvino"], 8) is None
    assert runtimes.fastest({"openvino": 12.5, "onnxruntime": 30.0}) == "onnxruntime"
    assert runtimes.fastest({"openvino": 30.0, "onnxruntime": 30.0}) == "openvino"  # a tie
    (tmp_path / runtimes.RATES_NAME).write_text("{not json")
    assert runtimes.recorded_rates(tmp_path, ["openvino"], 8) is None


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None,
                    reason="onnxruntime not installed (pip install -e \".[deploy]\")")
def test_the_export_is_made_once_and_again_for_a_changed_model(model_file, images, tmp_path):
    out = tmp_path / "p.jsonl"
    _predicted(model_file, images, out, "--runtime=onnxruntime")
    [entry] = runtimes.cache_root(model_file).iterdir()
    onnx = entry / "model.onnx"
    made = onnx.stat().st_mtime_ns
    _predicted(model_file, images, out, "--runtime=onnxruntime")
    assert onnx.stat().st_mtime_ns == made  # reused, not exported again
    # The model file changes (training again, another seed): exported again, the old entry
    # removed, and the outputs are the new model's.
    _model(2).save(model_file)
    got = _predicted(model_file, images, out, "--runtime=onnxruntime")
    [newer] = runtimes.cache_root(model_file).iterdir()
    assert newer != entry
    expected = _expected(model_file, images)
    np.testing.assert_allclose(got, expected, rtol=0,
                               atol=TOLERANCE * expected.max() + ROUNDING)


def test_an_unknown_runtime_is_one_line(model_file, images, capsys):
    assert predict.main(["predict", f"--model_file={model_file}", str(images[0]),
                         "--runtime=tvm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--runtime: invalid choice: 'tvm'" in err
    assert "'auto', 'openvino', 'onnxruntime', 'tensorflow'" in err


def test_a_missing_runtime_names_the_pip_extra_and_auto_takes_the_next(
        model_file, images, tmp_path, capsys, monkeypatch):
    _skip_unless("onnxruntime")
    monkeypatch.setitem(runtimes.MODULES, "openvino", "no_such_module_for_a_test")
    runtimes._import_problem.cache_clear()
    try:
        assert predict.main(["predict", f"--model_file={model_file}", str(images[0]),
                             "--runtime=openvino"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: --runtime=openvino: runtime "
                                                       "'openvino' is not installed here")
        assert 'pip install "keras-efficientnet[deploy]"' in err
        assert not runtimes.cache_root(model_file).exists()  # refused before any export
        # auto takes ONNX Runtime, the next installed.
        _predicted(model_file, images, tmp_path / "p.jsonl")
        [entry] = runtimes.cache_root(model_file).iterdir()
        assert [p.name for p in entry.iterdir()] == ["model.onnx"]
    finally:
        monkeypatch.undo()
        runtimes._import_problem.cache_clear()


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None,
                    reason="onnxruntime not installed (pip install -e \".[deploy]\")")
def test_requests_an_export_cannot_serve(model_file, images, capsys):
    # --serving chooses TensorFlow's computation: refused with another runtime.
    assert predict.main(["predict", f"--model_file={model_file}", str(images[0]),
                         "--runtime=onnxruntime", "--serving=off"]) == 2
    assert capsys.readouterr().err == (
        "error: --serving=off chooses TensorFlow's computation: give --runtime=tensorflow (or "
        "auto), not --runtime=onnxruntime\n")
    # An export takes the model's own resolution: refused by name, before any export.
    assert predict.main(["predict", f"--model_file={model_file}", str(images[0]),
                         "--runtime=onnxruntime", "--resolution=48"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes 32x32 images" in err


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_an_export_runtime_keeps_tensorflows_start_up_lines_off_the_terminal(
        runtime, model_file, images):
    # The command in its own process (in this one TensorFlow is loaded already): oneDNN forced
    # on prints its C++ notice on every CPU when TensorFlow loads unsilenced, as the image
    # decoding's import did for these runtimes.
    import os
    import subprocess
    import sys

    _skip_unless(runtime)
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    done = subprocess.run([sys.executable, "-m", "keras_efficientnet.cli.predict",
                           f"--runtime={runtime}", f"--model_file={model_file}", str(images[0])],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert done.stdout.splitlines()[0] == str(images[0])
