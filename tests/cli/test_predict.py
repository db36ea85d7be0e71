"""The predict command: usage errors before TensorFlow, folders, batches, CSV and JSON lines
output, one line per bad file, ImageNet names for 1000-class models."""

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_efficientnet as ke
from keras_efficientnet.cli import predict
from keras_efficientnet.datasets.preprocessing import center_crop

pytestmark = pytest.mark.tf_only

REPO = Path(__file__).resolve().parents[1]
SIZE = 32


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 3-class model with class_names.json, a 1000-class and a headless one (no names), a
    folder of 5 images two levels deep, a text file named like an image and a fake .keras."""
    root = tmp_path_factory.mktemp("predict")
    three = root / "three" / "model.keras"
    three.parent.mkdir()
    import keras

    keras.utils.set_random_seed(0)
    model = ke.EfficientNet("tiny", classes=3, input_shape=(SIZE, SIZE, 3))
    rng = np.random.default_rng(1)
    for weight in model.weights:  # perturbed (not BatchNorm's statistics): images score apart
        if "moving" not in weight.path:
            weight.assign(weight.numpy() + rng.normal(0, 0.2, weight.shape).astype("float32"))
    model.save(three)
    (three.parent / "class_names.json").write_text(json.dumps(["ant", "bee", "cow"]))
    ke.EfficientNet("tiny", classes=1000, input_shape=(SIZE, SIZE, 3)).save(root / "in1k.keras")
    ke.EfficientNet("tiny", include_top=False, input_shape=(SIZE, SIZE, 3)).save(
        root / "headless.keras")
    images = []
    for i, (folder, suffix, shape) in enumerate([("", ".png", (40, 48)), ("", ".jpg", (48, 40)),
                                                 ("a", ".png", (33, 70)), ("a/b", ".bmp", (40, 40)),
                                                 ("a/b", ".jpeg", (64, 50))]):
        path = root / "photos" / folder / f"{i}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        image = rng.integers(0, 64, (*shape, 3), dtype=np.uint8)
        image[..., i % 3] += 48 * i  # colours apart, so that the model scores them apart
        Image.fromarray(image).save(path)
        images.append(path)
    (root / "photos" / "a" / "notes.txt").write_text("not an image, and not picked up")
    (root / "fake.png").write_text("text, named like an image")
    (root / "fake.keras").write_text("not a zip")
    return dict(root=root, three=three, in1k=root / "in1k.keras",
                headless=root / "headless.keras", images=images)


def _expected(model_file, paths):
    """Probabilities of the saved model for each file's centre crop (its own decode)."""
    import keras

    model = keras.models.load_model(model_file)
    crops = np.stack([center_crop(tf.io.read_file(str(p)), SIZE).numpy() for p in paths])
    return keras.ops.convert_to_numpy(model(crops)).astype("float64")


def test_folders_batches_csv_and_bad_files(files, tmp_path, capsys):
    out = tmp_path / "pred.csv"
    fake = files["root"] / "fake.png"
    rc = predict.main(["predict", f"--model_file={files['three']}", str(files["root"] / "photos"),
                       str(fake), "--batch_size=2", "--top_k=2", f"--output={out}"])
    printed = capsys.readouterr()
    assert rc == 2  # one bad file; the others are predicted and written
    assert printed.err == f"error: {fake}: not an image (expected JPEG, PNG, BMP or GIF)\n"
    assert printed.out == f"wrote 5 predictions to {out}\n"
    rows = list(csv.DictReader(out.open()))
    # Recursive, sorted within the folder: a/2.png, a/b/3.bmp, a/b/4.jpeg, 0.png, 1.jpg.
    order = sorted(files["images"])
    assert [row["path"] for row in rows] == [str(p) for p in order]
    expected = _expected(files["three"], order)
    assert np.ptp(expected, axis=0).max() > 0.01  # the images score differently
    for row, probs in zip(rows, expected):
        best = np.argsort(-probs, kind="stable")[:2]
        assert [row["index_1"], row["index_2"]] == [str(i) for i in best]
        assert [row["class_1"], row["class_2"]] == [["ant", "bee", "cow"][i] for i in best]
        assert float(row["probability_1"]) == pytest.approx(probs[best[0]], abs=2e-6)
        assert "class_3" not in row


def test_jsonl_and_imagenet_names_for_a_1000_class_model(files, tmp_path, capsys):
    out = tmp_path / "pred.jsonl"
    paths = files["images"][:2]
    assert predict.main(["predict", f"--model_file={files['in1k']}", *map(str, paths),
                         f"--output={out}", "--top_k=3"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    expected = _expected(files["in1k"], paths)
    decoded = ke.decode_predictions(expected, top=3)
    assert [r["path"] for r in records] == [str(p) for p in paths]
    for record, probs, names in zip(records, expected, decoded):
        assert [t["name"] for t in record["top_k"]] == [name for _, name, _ in names]
        assert [t["probability"] for t in record["top_k"]] == pytest.approx(
            [score for _, _, score in names], abs=2e-6)
        assert record["top_k"][0]["index"] == int(np.argmax(probs))


def test_a_model_without_a_classifier_head_is_one_line(files, tmp_path, capsys):
    image = str(files["images"][0])
    assert predict.main(["predict", f"--model_file={files['headless']}", image]) == 2
    assert capsys.readouterr().err == (
        f"error: {files['headless']}: no classifier head (built with include_top=False, it "
        "outputs features); a command needs a model that outputs class scores\n")
    # A model of another kind is checked once loaded, by its output's shape.
    import keras

    features = keras.Sequential([keras.Input((SIZE, SIZE, 3)), keras.layers.Conv2D(2, 3)])
    features.save(tmp_path / "features.keras")
    assert predict.main(["predict", f"--model_file={tmp_path / 'features.keras'}", image]) == 2
    error = capsys.readouterr().err
    assert "no classifier head (its output has shape (None, 30, 30, 2))" in error
    assert error.count("\n") == 1


# Each case runs as a new process with a stand-in `tensorflow` package that fails on import:
# the error it prints shows the check came before TensorFlow (and Keras, which imports it).
USAGE_ERRORS = [
    ([], "error: --model_file is required"),
    (["--model_file={root}/missing.keras", "x.png"],
     "error: --model_file='{root}/missing.keras': no such"),
    (["--model_file={root}/fake.keras", "x.png"],
     "error: {root}/fake.keras: not a Keras model file"),
    (["--model_file={headless}", "{image}"], "error: {headless}: no classifier head"),
    (["--model_file={model}"], "error: no images given"),
    (["--model_file={model}", "nope.png"], "error: nope.png: no such file or folder"),
    (["--model_file={model}", "{root}/fake.png"], "error: {root}/fake.png: not an image"),
    (["--model_file={model}", "--class_names=none.json", "{image}"],
     "error: --class_names='none.json': no such file"),
    (["--model_file={model}", "--output=x.txt", "{image}"], "error: --output='x.txt': give a .csv"),
    (["--top_k=0"], "error: --top_k=0: must be at least 1"),
    (["--bogus"], "error: unrecognized arguments: --bogus (see --help)"),
]


def _run_without_tensorflow(tmp_path, argv):
    stand_in = tmp_path / "no_tf" / "tensorflow"
    stand_in.mkdir(parents=True, exist_ok=True)
    (stand_in / "__init__.py").write_text("raise ImportError('TensorFlow was imported')\n")
    env = dict(os.environ, PYTHONPATH=f"{stand_in.parent}{os.pathsep}{REPO}")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "keras_efficientnet.predict", *argv], env=env,
                          capture_output=True, text=True, timeout=60)
    return done, time.perf_counter() - start


def test_help_and_usage_errors_come_before_tensorflow_in_one_line(files, tmp_path):
    names = dict(root=files["root"], model=files["three"], headless=files["headless"],
                 image=files["images"][0])
    seconds = []
    for argv, message in USAGE_ERRORS:
        done, elapsed = _run_without_tensorflow(tmp_path, [a.format(**names) for a in argv])
        assert (done.returncode, done.stdout) == (2, ""), (argv, done.stderr)
        assert done.stderr.startswith(message.format(**names)), (argv, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        seconds.append(elapsed)
    # Well under the second asked for (TensorFlow's import alone takes several here).
    assert min(seconds) < 1.0, seconds
    done, _ = _run_without_tensorflow(tmp_path, ["--help"])
    assert done.returncode == 0 and "--output" in done.stdout and "--batch_size" in done.stdout


def test_the_deprecated_model_flag_predicts_the_same_with_one_warning(files, capsys):
    image = str(files["images"][0])
    assert predict.main(["predict", f"--model_file={files['three']}", image]) == 0
    current = capsys.readouterr()
    assert predict.main(["predict", f"--model={files['three']}", image]) == 0
    old = capsys.readouterr()
    assert old.out == current.out and current.err == ""
    assert old.err == ("warning: keras-efficientnet-predict --model is deprecated and goes in the "
                       "next release; use --model_file (the same value): --model names an "
                       "architecture preset in every command\n")


# Names a spreadsheet would run as formulas, CSV's own specials, a leading quote, UTF-8 and
# (as bytes) names that are not UTF-8, which Linux filesystems take.
ODD_NAMES = ["=1+2", "+cmd", "-x", "@SUM(A1)", "'quoted", "\tTab", "plain, comma",
             'say "hi"', "line\nbreak", "été", b"\xff\xfe-latin1 \xe9t\xe9"]


def _unquote(cell: str) -> str:
    """The documented reading of predict's CSV: drop one leading ' where there is one."""
    return cell[1:] if cell.startswith("'") else cell


def test_csv_cells_never_start_a_formula_and_every_name_round_trips(files, tmp_path, capsys):
    folder = tmp_path / "odd"
    folder.mkdir()
    source = files["images"][0].read_bytes()
    paths = []
    for name in ODD_NAMES:
        name = os.fsdecode(name) if isinstance(name, bytes) else name
        path = folder / f"{name}.png"
        try:
            path.write_bytes(source)
        except (OSError, UnicodeEncodeError):  # a filesystem that refuses the name
            continue
        paths.append(path)
    assert len(paths) >= len(ODD_NAMES) - 1
    class_names = tmp_path / "names.json"
    class_names.write_text(json.dumps(["=HYPERLINK(\"http://x\")", "-1", "'ok"]))
    out = tmp_path / "pred.csv"
    rc = predict.main(["predict", f"--model_file={files['three']}", str(folder), "--top_k=3",
                       f"--class_names={class_names}", f"--output={out}"])
    assert rc == 0, capsys.readouterr().err
    with open(out, newline="", encoding="utf-8", errors="surrogateescape") as f:
        rows = list(csv.reader(f))
    cells = [cell for row in rows[1:] for cell in row]
    assert not [c for c in cells if c.startswith(("=", "+", "-", "@", "\t", "\r"))]
    assert sorted(_unquote(row[0]) for row in rows[1:]) == sorted(map(str, paths))
    assert {_unquote(row[1]) for row in rows[1:]} <= {"=HYPERLINK(\"http://x\")", "-1", "'ok"}
    assert {_unquote(c) for row in rows[1:] for c in row[1::3]} == {
        "=HYPERLINK(\"http://x\")", "-1", "'ok"}  # every class is somewhere in the top 3
    # The bytes of each name come back: the file the row names is the one predicted.
    assert all(os.path.exists(os.fsencode(_unquote(row[0]))) for row in rows[1:])
    # JSON lines and the printed lines take the same names.
    jsonl = tmp_path / "pred.jsonl"
    assert predict.main(["predict", f"--model_file={files['three']}", str(folder),
                         f"--output={jsonl}"]) == 0
    assert sorted(json.loads(line)["path"] for line in jsonl.read_text().splitlines()) == \
        sorted(map(str, paths))
    capsys.readouterr()
    assert predict.main(["predict", f"--model_file={files['three']}", str(folder)]) == 0
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    assert printed.out.count(f"{folder}/") == len(paths)


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_an_output_that_is_a_folder_or_a_link_is_one_line_before_tensorflow(files, tmp_path,
                                                                            kind):
    # It was a traceback (a folder) or a write after every image was predicted (a link).
    output, victim = tmp_path / "out.csv", tmp_path / "victim.csv"
    victim.write_text("precious\n")
    output.mkdir() if kind == "directory" else output.symlink_to(victim)
    found = "a directory" if kind == "directory" else f"a symbolic link (to {str(victim)!r})"
    done, _ = _run_without_tensorflow(tmp_path, [f"--model_file={files['three']}",
                                                 str(files["images"][0]), f"--output={output}"])
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        f"error: --output={str(output)!r} is {found}: predict writes its own regular file "
        "there, never into a folder or through a link; give the path of a new .csv or .jsonl "
        "file (or remove what is there)\n")
    assert victim.read_text() == "precious\n"


def test_a_named_pipe_among_the_images_is_one_line_and_never_blocks(files, tmp_path, capsys):
    import signal

    pipe = tmp_path / "pipe.png"
    os.mkfifo(pipe)
    signal.alarm(60)  # a blocked read fails the test instead of hanging the suite
    try:
        status = predict.main(["predict", f"--model_file={files['three']}",
                               str(files["images"][0]), str(pipe)])
    finally:
        signal.alarm(0)
    assert status == 2
    err = capsys.readouterr().err
    assert f"error: {pipe} is a named pipe (FIFO), not a regular file" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_is_told_what_loads_first(files, monkeypatch, capsys):
    """On a terminal the first line (stderr) names the model and runtime before the seconds
    of loading; stdout keeps the predictions alone."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    image = str(files["images"][0])
    assert predict.main(["predict", f"--model_file={files['three']}", image,
                         "--runtime=tensorflow"]) == 0
    assert terminal.getvalue().splitlines()[0] == f"loading: {files['three']} on tensorflow"
    assert "loading" not in capsys.readouterr().out
