"""The standalone evaluate command: a saved model's top-1, top-5 and loss on an image folder,
against the same figures computed here from its predictions; usage errors before TensorFlow."""

import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_efficientnet as ke
from keras_efficientnet.cli import evaluate
from keras_efficientnet.datasets.preprocessing import center_crop

pytestmark = pytest.mark.tf_only
REPO = Path(__file__).resolve().parents[1]


def test_scores_a_folder_like_numpy(tmp_path, capsys):
    rng = np.random.default_rng(0)
    files, labels = [], []
    for label, name in enumerate(("ant", "bee", "cow")):
        folder = tmp_path / "photos" / "validation" / name
        folder.mkdir(parents=True)
        for i in range(4):
            image = rng.integers(0, 90, (36, 40, 3), dtype=np.uint8)
            image[..., label] += 40 * (i + 1)
            Image.fromarray(image).save(folder / f"{i}.png")
            files.append(folder / f"{i}.png")
            labels.append(label)
    keras.utils.set_random_seed(0)
    model = ke.EfficientNet("tiny", classes=3, input_shape=(32, 32, 3))
    for weight in model.weights:
        if "moving" not in weight.path:
            weight.assign(weight.numpy() + rng.normal(0, 0.2, weight.shape).astype("float32"))
    model.save(tmp_path / "m.keras")
    status = evaluate.main(["evaluate", f"--model_file={tmp_path / 'm.keras'}",
                            f"--dataset=folder:{tmp_path / 'photos'}", "--batch_size=5"])
    out = capsys.readouterr().out
    assert status == 0, out
    crops = np.stack([center_crop(tf.io.read_file(str(f)), 32).numpy() for f in files])
    probs = keras.ops.convert_to_numpy(model(crops)).astype("float64")
    labels = np.array(labels)
    top1 = np.mean(np.argmax(probs, -1) == labels)
    loss = np.mean(-np.log(probs[np.arange(len(labels)), labels]))
    found = re.search(r": top-1 ([\d.]+) on all 12 validation images; top-5 ([\d.]+)  "
                      r"loss ([\d.]+)  ([\d.]+) images/s", out)
    assert found, out
    assert float(found[1]) == pytest.approx(top1, abs=1e-4)
    assert float(found[2]) == 1.0  # 3 classes: always in the top 5
    assert float(found[3]) == pytest.approx(loss, abs=1e-4)
    assert float(found[4]) > 0
    # A score of fewer images says how many, of how many, and why.
    status = evaluate.main(["evaluate", f"--model_file={tmp_path / 'm.keras'}",
                            f"--dataset=folder:{tmp_path / 'photos'}", "--batch_size=5",
                            "--steps=1"])
    out = capsys.readouterr().out
    assert status == 0 and re.search(r": top-1 [\d.]+ on 5 of 12 validation images "
                                     r"\(--steps=1 of --batch_size=5\); top-5", out), out


def test_score_reads_the_data_once_and_counts_the_images_it_scored():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (7, 32, 32, 3)).astype("uint8")
    labels = np.array([0, 1, 2, 0, 1, 2, 0])
    passes = []

    def examples():
        passes.append(1)
        yield from zip(images, labels)

    data = tf.data.Dataset.from_generator(examples, output_signature=(
        tf.TensorSpec((32, 32, 3), tf.uint8), tf.TensorSpec((), tf.int64))).batch(3)
    keras.utils.set_random_seed(0)
    model = ke.EfficientNet("tiny", classes=3, input_shape=(32, 32, 3))
    result = evaluate.score(model, data, 3)  # batches: 3 + 3 + 1
    assert passes == [1] and result["images"] == 7
    probs = keras.ops.convert_to_numpy(model(images)).astype("float64")
    assert result["top1"] == pytest.approx(np.mean(np.argmax(probs, -1) == labels), abs=1e-6)
    assert result["loss"] == pytest.approx(
        np.mean(-np.log(probs[np.arange(7), labels])), rel=1e-4)


def test_usage_errors_before_tensorflow(tmp_path):
    stand_in = tmp_path / "no_tf" / "tensorflow"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise ImportError('TensorFlow was imported')\n")
    env = dict(os.environ, PYTHONPATH=f"{stand_in.parent}{os.pathsep}{REPO}")
    (tmp_path / "fake.keras").write_text("no zip")
    for argv, message in (
            ([], "error: --model_file is required"),
            ([f"--model_file={tmp_path / 'fake.keras'}"], "not a Keras model file"),
            ([f"--model_file={tmp_path / 'fake.keras'}", "--steps=-1"], "not a Keras model file"),
    ):
        done = subprocess.run([sys.executable, "-m", "keras_efficientnet.evaluate", *argv],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1
    done = subprocess.run([sys.executable, "-m", "keras_efficientnet.evaluate", "--help"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--dataset" in done.stdout


@pytest.mark.parametrize("damage", ["not json", "link"])
def test_an_unreadable_config_json_beside_the_model_is_one_line_not_ignored(tmp_path, damage):
    # The run's --validation_split comes from it: ignored, the held-out share would silently
    # be scored with the images the run trained on.
    stand_in = tmp_path / "no_tf" / "tensorflow"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise ImportError('TensorFlow was imported')\n")
    run = tmp_path / "run"
    run.mkdir()
    ke.EfficientNet("tiny", classes=3, input_shape=(32, 32, 3)).save(run / "model.keras")
    config = run / "config.json"
    if damage == "link":
        (tmp_path / "elsewhere.json").write_text("{}")
        config.symlink_to(tmp_path / "elsewhere.json")
    else:
        config.write_text("{not json")
    env = dict(os.environ, PYTHONPATH=f"{stand_in.parent}{os.pathsep}{REPO}")
    argv = [sys.executable, "-m", "keras_efficientnet.evaluate", f"--model_file={run}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {config}")
    assert ("not JSON" if damage == "not json" else "is a symbolic link") in done.stderr
    assert done.stderr.endswith("the run's --validation_split cannot be read from it; fix or "
                                "remove it, or give --validation_split (0 for none)\n")
    # Given on the command line, the file decides nothing: no refusal from it.
    done = subprocess.run([*argv, "--validation_split=0"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert "config.json" not in done.stderr
