"""The export command: a run directory or a .keras file to a SavedModel whose serving signature
gives the model's probabilities; bad input in one line before TensorFlow loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet.cli import export
from keras_efficientnet.training import run_dir

pytestmark = pytest.mark.tf_only

REPO = Path(__file__).resolve().parents[2]
SIZE = 32


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished run's folder holding a 3-class tiny model (softmax head) as model.keras."""
    import keras

    root = tmp_path_factory.mktemp("export")
    keras.utils.set_random_seed(0)
    model = ke.EfficientNet("tiny", classes=3, input_shape=(SIZE, SIZE, 3),
                            classifier_activation="softmax")
    rng = np.random.default_rng(1)
    for weight in model.weights:  # perturbed, so that images score apart
        if "moving" not in weight.path:
            weight.assign(weight.numpy() + rng.normal(0, 0.2, weight.shape).astype("float32"))
    (root / "run").mkdir()
    model.save(root / "run" / "model.keras")
    images = rng.integers(0, 256, (4, SIZE, SIZE, 3), dtype=np.uint8)
    expected = keras.ops.convert_to_numpy(model(images.astype("float32"))).astype("float64")
    return root, images, expected


def _served(path: Path, images: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    return next(iter(signature(images=tf.constant(images)).values())).numpy()


def test_a_run_exports_its_models_probabilities(run, tmp_path, capsys):
    root, images, expected = run
    out = tmp_path / "saved_model"
    assert export.main(["export", str(root / "run"), f"--output={out}"]) == 0
    loading, printed = capsys.readouterr().out.split("\n", 1)
    assert loading == f"loading: TensorFlow, then {root / 'run' / 'model.keras'}"
    assert printed.startswith(f"wrote saved_model {out} from {root / 'run' / 'model.keras'}")
    np.testing.assert_allclose(_served(out, images), expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(expected.sum(-1), 1.0, atol=1e-5)  # probabilities, not logits
    assert json.loads((out / run_dir.EXPORT_MARK).read_text())["format"] == "tf_saved_model"


def test_a_source_is_a_run_directorys_final_model_or_the_file_itself(run):
    root, _, _ = run
    model = root / "run" / "model.keras"
    assert export.model_file_of(str(root / "run")) == export.model_file_of(str(model)) == model


def test_bad_input_is_one_line_before_tensorflow_loads(run, tmp_path):
    root, _, _ = run
    stand_in = tmp_path / "no_tf" / "tensorflow"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise ImportError('TensorFlow was imported')\n")
    env = dict(os.environ, PYTHONPATH=f"{stand_in.parent}{os.pathsep}{REPO}")
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "fake.keras").write_text("no zip")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("someone's")
    good = str(root / "run")
    for argv, message in [
        ([], "error: the following arguments are required: SOURCE (see --help)"),
        ([str(tmp_path / "nope")], f"error: SOURCE {str(tmp_path / 'nope')!r}: no such run"),
        ([str(tmp_path / "empty_run")], "is a folder without model.keras"),
        ([str(tmp_path / "fake.keras"), "--output=x"], "not a Keras model file"),
        ([good], "error: --output is required"),
        ([good, "--output=x", "--format=tflite"],
         "argument --format: invalid choice: 'tflite'"),
        ([good, "--format=onnx"], "error: --output is required: what to write, e.g. "
                                  "--output=runs/default/model.onnx"),
        ([good, f"--output={tmp_path / 'taken'}", "--format=onnx"],
         "is a link or a folder; give the onnx file to write"),
        ([good, "--output=x.onnx", "--format=onnx", "--int8"],
         "error: --int8 needs --calibration=DATASET"),
        ([good, "--output=x", "--int8", "--calibration=digits"],
         "error: --int8 quantizes an onnx or openvino export, not --format=saved_model"),
        ([good, "--output=x.onnx", "--format=onnx", "--calibration=digits"],
         "error: --calibration is for --int8"),
        ([good, "--output=x.onnx", "--format=openvino", "--int8",
          f"--calibration=folder:{tmp_path / 'nope'}"], "error: --calibration=folder:"),
        ([good, "--output=x.onnx", "--format=onnx", "--int8", "--calibration=digits",
          "--calibration_images=0"], "error: --calibration_images=0: must be at least 1"),
        ([good, f"--output={tmp_path / 'taken'}"],
         f"error: --output={str(tmp_path / 'taken')!r} is a non-empty directory"),
    ]:
        done = subprocess.run([sys.executable, "-m", "keras_efficientnet.cli.export", *argv],
                              env=env, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (2, ""), (argv, done.stderr)
        assert message in done.stderr and done.stderr.count("\n") == 1, (argv, done.stderr)
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("fmt, name", [("onnx", "model.onnx"), ("openvino", "model")])
def test_a_run_exports_for_cpu_runtimes(run, tmp_path, capsys, fmt, name):
    pytest.importorskip("onnx", reason="onnx is not installed (the `deploy` extra)")
    root, images, expected = run
    out = tmp_path / name
    assert export.main(["export", str(root / "run"), f"--output={out}", f"--format={fmt}"]) == 0
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        served = session.run(None, {"images": images})[0]
    else:
        ov = pytest.importorskip("openvino", reason="openvino is not installed")
        out = tmp_path / "model.xml"
        served = ov.Core().compile_model(str(out), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(
            images)[0]
    assert capsys.readouterr().out.split("\n", 1)[1].startswith(f"wrote {fmt} {out} from ")
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)


def test_a_missing_runtime_is_named_with_the_extra_to_install():
    with pytest.raises(export.BadInput, match=r"^no_such_runtime is not installed: pip install "
                       r"'keras-efficientnet\[deploy\]'$"):
        export.check_packages(["json", "no_such_runtime"])


def test_a_run_exports_int8_onnx_calibrated_on_a_dataset(run, tmp_path, capsys):
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (the `deploy` extra)")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    root, images, expected = run
    out = tmp_path / "int8.onnx"
    assert export.main(["export", str(root / "run"), f"--output={out}", "--format=onnx",
                        "--int8", "--calibration=digits", "--calibration_images=32"]) == 0
    assert capsys.readouterr().out.split("\n", 1)[1].startswith(f"wrote int8 onnx {out} from ")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert any(node.op_type == "QuantizeLinear" for node in onnx.load(str(out)).graph.node)
    served = session.run(None, {"images": images})[0]
    np.testing.assert_allclose(served.sum(-1), 1.0, atol=1e-5)  # still probabilities
