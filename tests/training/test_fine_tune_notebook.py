"""Executes examples/fine_tune.ipynb in a scratch directory, offline: it makes its photos (three
classes of coloured shapes), a model to start from (the smoke recipe on the digits), trains on
the photos with --weights and validation every epoch, plots metrics.csv, evaluates best.keras
and predicts the validation folder to CSV. The numbers it prints are checked against the files
the run wrote and against each other."""

import csv
import json
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf_only
REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "fine_tune.ipynb"


@pytest.mark.slow  # about 1-1.5 minutes on 2 quiet cores: 4 commands' start-ups, a tiny model
def test_fine_tune_notebook_runs_end_to_end(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", os.environ.get("TF_ENABLE_ONEDNN_OPTS", "0"))
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code"
               for out in cell.get("outputs", [])]
    text = "".join(out.get("text", "") for out in outputs)
    assert "its 3-class classifier is newly initialized (the file's has 10 classes)" in text
    fine_tune = text[text.index("--weights=fine_tune/pretrained/model.keras"):]
    printed = [float(v) for v in re.findall(r"val_top1: ([0-9.]+)", fine_tune.split("$ ")[0])]
    run = tmp_path / "fine_tune" / "run"
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert len(printed) == len(rows) == 8  # one validation per epoch, printed and in the CSV
    assert printed == pytest.approx([float(r["val_top1"]) for r in rows], abs=1e-4)
    assert max(printed) > 0.5, printed  # learned: chance is 1/3
    assert sum("image/png" in out.get("data", {}) for out in outputs) >= 2  # photos, curve
    best = json.loads((run / "best.json").read_text())
    assert best["epoch"] == printed.index(max(printed)) + 1  # the first best epoch
    evaluated = re.search(r"weights +fine_tune/run/best.keras\n +top-1 +([0-9.]+)", text)
    assert evaluated and float(evaluated.group(1)) == pytest.approx(best["val_top1"], abs=1e-4)
    right = re.search(r"predict: (\d+) of 24 validation photos right", text)
    assert right, text[-3000:]
    # predict's argmax on the same 24 files agrees with evaluate's top-1 (one borderline image)
    assert abs(int(right.group(1)) / 24 - best["val_top1"]) <= 1 / 24 + 1e-6
