"""Writes examples/fine_tune.ipynb (cells only; execute it to fill in the outputs):

    python scripts/make_fine_tune_notebook.py
    cd "$(mktemp -d)" && PYTHONPATH=/path/to/checkout jupyter nbconvert --to notebook \
        --execute --output-dir=. /path/to/checkout/examples/fine_tune.ipynb
    # then copy the executed fine_tune.ipynb back over examples/fine_tune.ipynb

It runs where it is started: its folders (`fine_tune/`) are made in the working directory.
"""

from pathlib import Path

import nbformat

CELLS = [
    ("markdown", """# Fine-tune on your photos

From a folder of photos to a model that predicts them, with the commands a `pip install` gives:
`--weights` (start from a trained model), validation after every epoch (`metrics.csv`), the
best model kept (`best.keras`), `--mode=evaluate` of a run directory, and `predict` writing a
CSV. Each step is the command a user types in a terminal, run here from Python as
`python -m keras_efficientnet.train` etc. (the same programs as `keras-efficientnet-train`,
`keras-efficientnet-predict`) so that what they print stays in the notebook.

Your photos go in `PHOTOS/<split>/<class>/*.jpg` with splits `train` and `validation`; this
notebook makes a small folder of coloured shapes (three classes) so that it runs anywhere,
offline, in about a minute or two on a CPU."""),
    ("code", """import csv
import json
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from PIL import Image

WORK = Path("fine_tune")
PHOTOS, PRETRAINED, RUN = WORK / "photos", WORK / "pretrained", WORK / "run"
PROGRAMS = {"keras-efficientnet-train": "keras_efficientnet.train",
            "keras-efficientnet-predict": "keras_efficientnet.predict"}


def shell(program, *args):
    \"\"\"Runs a command as a terminal would and shows what it printed.\"\"\"
    print("$", program, " ".join(args))
    done = subprocess.run([sys.executable, "-m", PROGRAMS[program], *args],
                          capture_output=True, text=True)
    print(done.stdout + done.stderr)
    assert done.returncode == 0, done.returncode


rng = np.random.default_rng(0)  # three classes: a bright red, green or blue patch on noise
for split, count in (("train", 24), ("validation", 8)):
    for channel, name in enumerate(("red", "green", "blue")):
        folder = PHOTOS / split / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            image = rng.integers(0, 80, (32, 32, 3), dtype=np.uint8)
            y, x = rng.integers(2, 14, 2)
            image[y:y + 16, x:x + 16, channel] += 170
            Image.fromarray(image).save(folder / f"{i:03d}.png")
print({split: len(list((PHOTOS / split).rglob("*.png"))) for split in ("train", "validation")})
Image.fromarray(np.hstack([np.asarray(Image.open(PHOTOS / "train" / name / "000.png"))
                           for name in ("red", "green", "blue")])).resize((288, 96), 0)"""),
    ("markdown", """## A trained model to start from

Fine-tuning starts from a model trained on something else. Here that is the `smoke` recipe's
tiny model, trained for a few seconds on scikit-learn's digits (10 classes); in practice it is
a longer run's `model.keras`, or `--weights=imagenet` with a G1-BN preset
(`--model=efficientnet-b0-g1-bn`), which loads keras.applications' ImageNet weights."""),
    ("code", 'shell("keras-efficientnet-train", "--recipe=smoke", '
             'f"--model_dir={PRETRAINED}")'),
    ("markdown", """## Train on the photos, validating every epoch

`--weights=PATH` loads the model's weights; the photos have 3 classes, not 10, so the
classifier is new (the log says so). `--eval_every=1` scores the validation split after every
epoch with the weights the run would ship, and each new best top-1 is written to `best.keras`.
The smoke recipe's other flags (the tiny model, 32 px, micro-batch 16) stay; the optimizer is
RMSProp with a cosine schedule."""),
    ("code", """shell("keras-efficientnet-train", "--recipe=smoke", f"--dataset=folder:{PHOTOS}",
      f"--weights={PRETRAINED / 'model.keras'}", f"--model_dir={RUN}", "--mode=train",
      "--epochs=8", "--updates_per_epoch=4", "--eval_every=1", "--test_resolution=32",
      "--optimizer=rmsprop", "--learning_rate=0.003", "--lr_schedule=cosine",
      "--warmup_epochs=0")"""),
    ("markdown", "## The validation curve (`metrics.csv`) and the best model (`best.json`)"),
    ("code", """rows = list(csv.DictReader(open(RUN / "metrics.csv")))
epochs = [int(row["epoch"]) for row in rows]
plt.figure(figsize=(5, 3))
plt.plot(epochs, [float(row["top1"]) for row in rows], "o-", label="train top-1")
plt.plot(epochs, [float(row["val_top1"]) for row in rows], "o-", label="validation top-1")
plt.xlabel("epoch")
plt.ylabel("top-1")
plt.ylim(0, 1.05)
plt.legend()
plt.show()
best = json.loads((RUN / "best.json").read_text())
print(json.dumps(best, indent=1))"""),
    ("markdown", """## Evaluate the best model

No flag but the run directory: its `config.json` supplies the model, data and resolution.
`--evaluate_weights=best` scores `best.keras` (by default `model.keras`, what the run
shipped)."""),
    ("code", """shell("keras-efficientnet-train", "--mode=evaluate", f"--model_dir={RUN}",
      "--evaluate_weights=best")"""),
    ("markdown", "## Predict a folder into a CSV"),
    ("code", """shell("keras-efficientnet-predict", f"--model_file={RUN / 'best.keras'}",
      str(PHOTOS / "validation"), f"--output={RUN / 'predictions.csv'}", "--top_k=2")
predictions = list(csv.DictReader(open(RUN / "predictions.csv")))
print(", ".join(predictions[0]))
for row in predictions[:3]:
    print(row["path"], "->", row["class_1"], row["probability_1"])
right = sum(Path(row["path"]).parent.name == row["class_1"] for row in predictions)
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
