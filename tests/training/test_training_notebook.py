"""Executes examples/quickstart.ipynb end to end with smoke settings (two epochs), offline."""

import os
import re
from pathlib import Path

import pytest

from tests.models.keras_applications_h5 import (
    randomized_keras_applications,
    write_keras_applications_h5,
)

pytestmark = pytest.mark.tf_only

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.ipynb"


# Behind slow (about 35 s on 2 quiet cores, the default suite's longest test): the library calls
# the notebook makes are each tested in the default suite (fit on a dataset:
# tests/models/test_keras_input_habits.py; save and load: test_serialization.py; a
# keras.applications weights file: test_pretrained.py); `make test-slow` runs the notebook.
@pytest.mark.slow
def test_quickstart_notebook_runs_and_reports_accuracy(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The fine-tuning cell loads a keras.applications-layout file instead of downloading the
    # ImageNet weights: a randomized stand-in.
    weights = write_keras_applications_h5(randomized_keras_applications("b0"),
                                          tmp_path / "efficientnetb0.h5")
    monkeypatch.setenv("QUICKSTART_EPOCHS", "2")
    monkeypatch.setenv("QUICKSTART_WEIGHTS", str(weights))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code"
               for out in cell.get("outputs", [])]
    text = "".join(out.get("text", "") for out in outputs)
    found = re.search(r"held-out top-1 ([0-9.]+)", text)
    assert found, text[-2000:]
    # Two epochs of real digits already beat chance (0.1) by far.
    assert float(found.group(1)) > 0.3
    assert "reloaded top-1" in text
    assert any("image/png" in out.get("data", {}) for out in outputs)  # the training curve
    assert f"weights: {weights}" in text and re.search(r"fine-tuned top-1 [0-9.]+", text)
