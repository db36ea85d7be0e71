"""The photos path end to end on a tiny plain folder of class folders: the finetune-photos recipe
with --validation_split, the hold-out recorded in config.json, then scored again, the same
images, by `--mode=evaluate --model_dir=RUN` and by keras-efficientnet-evaluate."""

from __future__ import annotations

import json

import numpy as np
import pytest
from absl import flags
from PIL import Image

from keras_efficientnet import recipes
from keras_efficientnet.cli import evaluate as evaluate_cli
from keras_efficientnet.cli import train as train_cli

pytestmark = pytest.mark.tf_only

# 3 classes of 10, 8 and 5 images; 0.2 held out, rounded half up (by hand): 2.0 -> 2,
# 1.6 -> 2, 1.0 -> 1: 5 validation images, 18 training images.
COUNTS = {"red": 10, "green": 8, "blue": 5}
HELD_OUT = 5


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos") / "photos"
    rng = np.random.default_rng(0)
    for channel, (name, count) in enumerate(COUNTS.items()):
        (root / name).mkdir(parents=True)
        for i in range(count):
            image = rng.integers(0, 60, (20, 24, 3)).astype(np.uint8)
            image[..., channel] += 180  # each class its own colour
            Image.fromarray(image).save(root / name / f"{i:02d}.png")
    return root


def _train(*argv) -> int:
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", *map(str, argv)])
    try:
        return train_cli.main(["train"])
    finally:
        flags.FLAGS.unparse_flags()


@pytest.fixture(scope="module")
def run(photos, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("photos-run") / "run"
    status = _train(f"--flagfile={recipes.recipe_path('finetune-photos')}",
                    f"--dataset=folder:{photos}", "--validation_split=0.2", "--weights=",
                    "--model=efficientnet-tiny-g1-bn", "--train_resolution=32",
                    "--test_resolution=32", "--epochs=1", "--micro_batch_size=6",
                    f"--model_dir={run_dir}", "--verbose=0")
    assert status == 0
    return run_dir


def test_the_hold_out_is_recorded_and_scored_again_on_the_same_images(photos, run, capsys):
    record = json.loads((run / "config.json").read_text())
    assert record["config"]["validation_split"] == 0.2
    assert record["class_names"] == sorted(COUNTS)
    results = json.loads((run / "results.json").read_text())
    assert (results["train_examples"], results["eval_examples"]) == (23 - HELD_OUT, HELD_OUT)
    capsys.readouterr()
    # --mode=evaluate with no other flag: config.json supplies the dataset and the hold-out.
    assert _train("--mode=evaluate", f"--model_dir={run}", "--verbose=0") == 0
    scored = json.loads((run / "results-evaluate.json").read_text())
    assert scored["eval_examples"] == HELD_OUT
    assert scored["top1"] == pytest.approx(results["top1"], abs=1e-6)
    # keras-efficientnet-evaluate on the run's model file takes the run's hold-out too.
    capsys.readouterr()
    assert evaluate_cli.main(["evaluate", f"--model_file={run / 'model.keras'}",
                              f"--dataset=folder:{photos}"]) == 0
    line = capsys.readouterr().out.strip()
    assert (f"(validation, held out of train by --validation_split=0.2): top-1 "
            f"{results['top1']:.4f} on all {HELD_OUT} validation images" in line), line
