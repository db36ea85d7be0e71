"""Executes examples/fine_tune.ipynb on a small made folder, offline (a keras.applications-layout
stand-in for the ImageNet file): train with --weights and validation, the curve, the best
model, evaluate, predict to CSV."""

import os
import re
from pathlib import Path

import pytest

from tests.models.keras_applications_h5 import (
    randomized_keras_applications,
    write_keras_applications_h5,
)

pytestmark = pytest.mark.tf_only
REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "fine_tune.ipynb"


@pytest.mark.slow  # about 3 minutes on 2 cores: B0 for 4 epochs and 4 commands' start-ups
def test_fine_tune_notebook_runs_end_to_end(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    weights = write_keras_applications_h5(randomized_keras_applications("b0"),
                                          tmp_path / "efficientnetb0.h5")
    monkeypatch.setenv("FINE_TUNE_WEIGHTS", str(weights))
    monkeypatch.setenv("FINE_TUNE_PHOTOS", str(tmp_path / "photos"))
    monkeypatch.setenv("FINE_TUNE_RUN", str(tmp_path / "run"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", os.environ.get("TF_ENABLE_ONEDNN_OPTS", "0"))
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code"
               for out in cell.get("outputs", [])]
    text = "".join(out.get("text", "") for out in outputs)
    assert "its 3-class classifier is newly initialized" in text, text[-3000:]
    assert len(re.findall(r"val_top1: [0-9.]+", text)) == 4  # one validation per epoch
    assert any("image/png" in out.get("data", {}) for out in outputs)  # the curve
    assert '"epoch"' in text and "best.keras" in text
    assert re.search(r"weights +.*run/model.keras", text)
    assert re.search(r"weights +.*run/best.keras", text)
    assert re.search(r"predict: \d+ of 36 validation photos right", text), text[-3000:]
