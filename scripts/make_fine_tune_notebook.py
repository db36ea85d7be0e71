"""Writes examples/fine_tune.ipynb (cells only; execute it to fill in the outputs):

    python scripts/make_fine_tune_notebook.py
    python -m tests.models.keras_applications_h5 b0 /tmp/efficientnetb0.h5   # offline stand-in
    FINE_TUNE_WEIGHTS=/tmp/efficientnetb0.h5 FINE_TUNE_RUN=/tmp/fine_tune_run \
        FINE_TUNE_PHOTOS=/tmp/fine_tune_photos jupyter nbconvert --to notebook --execute \
        --inplace examples/fine_tune.ipynb
"""

from pathlib import Path

import nbformat

CELLS = [
    ("markdown", """# Fine-tune on your photos

From a folder of photos to a model that predicts them, with the command line a `pip install`
gives: `--weights` (start from pretrained weights), validation after every epoch, the best model
kept, `--mode=evaluate` of what was trained, and `predict` writing a CSV. Each step below is the
command a user types in a terminal (here run from Python so the outputs stay in the notebook).

Your photos go in `PHOTOS/<split>/<class>/*.jpg` with splits `train` and `validation`
(`FINE_TUNE_PHOTOS`); where there is no such folder this notebook makes a small one of coloured
shapes (three classes).

The outputs committed with this notebook were made offline, with a randomized stand-in in
keras.applications' layout for the ImageNet file (`FINE_TUNE_WEIGHTS`): they show the steps
working, not what ImageNet pretraining buys."""),
    ("code", """import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

PHOTOS = Path(os.environ.get("FINE_TUNE_PHOTOS", "fine_tune_photos"))
# "imagenet" downloads keras.applications' B0 file once; the tests pass a local stand-in.
WEIGHTS = os.environ.get("FINE_TUNE_WEIGHTS", "imagenet")
RUN = Path(os.environ.get("FINE_TUNE_RUN", "runs/fine_tune"))


def shell(*args):
    \"\"\"Runs a command as a terminal would and shows what it printed.\"\"\"
    print("$", " ".join(args))
    done = subprocess.run(args, capture_output=True, text=True)
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.returncode


if not PHOTOS.exists():  # three classes of coloured shapes, 48x40 pixels
    rng = np.random.default_rng(0)
    for split, count in (("train", 32), ("validation", 12)):
        for label, name in enumerate(("red_square", "green_disc", "blue_bar")):
            folder = PHOTOS / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                image = rng.integers(0, 80, (48, 40, 3), dtype=np.uint8)
                y, x = rng.integers(4, 20, 2)
                image[y:y + 20, x:x + 16, label] += 170
                Image.fromarray(image).save(folder / f"{i:03d}.png")
print(sorted(p.name for p in (PHOTOS / "train").iterdir()))"""),
    ("markdown", """## Train from pretrained weights, validating every epoch

`--weights=imagenet` starts from keras.applications' ImageNet weights (the G1-BN presets are
keras.applications' EfficientNet); the classifier is new because the class count differs. The
run trains at 32 px, averages the per-epoch weights, fine-tunes the head at 64 px, and validates
after every epoch (`--eval_every=1`) with the weights it would ship."""),
    ("code", """TRAIN = os.environ.get("FINE_TUNE_TRAIN", "keras-efficientnet-train")
train = [sys.executable, "-m", "keras_efficientnet.train"]  # = keras-efficientnet-train
shell(*train, "--recipe=default", "--model=efficientnet-b0-g1-bn", f"--weights={WEIGHTS}",
      f"--dataset=folder:{PHOTOS}", f"--model_dir={RUN}", "--noresume", "--epochs=4",
      "--finetune_epochs=1", "--train_resolution=32", "--test_resolution=64",
      "--micro_batch_size=16", "--verbose=2")"""),
    ("markdown", "## The validation curve (`metrics.csv`) and the best model (`best.json`)"),
    ("code", """rows = list(csv.DictReader(open(RUN / "metrics.csv")))
epochs = [int(r["epoch"]) for r in rows]
plt.plot(epochs, [float(r["top1"]) for r in rows], "o-", label="train top-1")
plt.plot(epochs, [float(r["val_top1"]) for r in rows], "o-", label="validation top-1")
plt.xlabel("epoch"); plt.ylabel("top-1"); plt.legend(); plt.show()
print(json.dumps(json.loads((RUN / "best.json").read_text()), indent=1))"""),
    ("markdown", """## Evaluate what was trained

No flag but the run directory: the run's `config.json` supplies the model, data and
resolutions. `model.keras` (what the run shipped) by default, `best.keras` on request."""),
    ("code", """shell(*train, "--mode=evaluate", f"--model_dir={RUN}")
shell(*train, "--mode=evaluate", f"--model_dir={RUN}", "--evaluate_weights=best")"""),
    ("markdown", "## Predict a folder into a CSV"),
    ("code", """# = keras-efficientnet-predict
predict = [sys.executable, "-m", "keras_efficientnet.predict"]
shell(*predict, f"--model={RUN / 'model.keras'}", str(PHOTOS / "validation"),
      f"--output={RUN / 'predictions.csv'}", "--top_k=2")
predictions = list(csv.DictReader(open(RUN / "predictions.csv")))
for row in predictions[:3]:
    print(row["path"], "->", row["class_1"], row["probability_1"])
right = sum(Path(r["path"]).parent.name == r["class_1"] for r in predictions)
print(f"predict: {right} of {len(predictions)} validation photos right")"""),
]


def main() -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(text) if kind == "markdown"
                      else nbformat.v4.new_code_cell(text) for kind, text in CELLS]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    path = Path(__file__).resolve().parents[1] / "examples" / "fine_tune.ipynb"
    nbformat.write(notebook, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
