"""Executes examples/quickstart.ipynb end to end with smoke settings (two epochs)."""

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf_only

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_runs_and_reports_accuracy():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    os.environ["QUICKSTART_EPOCHS"] = "2"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = "".join(out.get("text", "") for cell in notebook.cells
                      if cell.cell_type == "code" for out in cell.get("outputs", []))
    found = re.search(r"held-out top-1 ([0-9.]+)", outputs)
    assert found, outputs[-2000:]
    # Two epochs of real digits already beat chance (0.1) by far.
    assert float(found.group(1)) > 0.3
    assert "reloaded top-1" in outputs
