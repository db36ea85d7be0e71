"""The README's quick start, taken from README.md itself: offline, public names only (fast), and
executed as pasted in an empty directory with fresh data (slow: about 30 s of CPU), so that it
cannot rot."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import keras_efficientnet as ke

REPO = Path(__file__).resolve().parents[1]
# The first screen: the quick start is in it (issue 35), within the README's first 40 lines.
FIRST_SCREEN_LINES = 40


def quick_start() -> tuple[str, int]:
    """The quick start's one Python block and the README line its fence closes on."""
    text = (REPO / "README.md").read_text()
    start = text.index("\n## Quick start\n")
    section = text[start:].split("\n## ", 2)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the quick start is one ```python block"
    end = text.index(blocks[0], start) + len(blocks[0])
    return blocks[0], text[:end].count("\n") + 1


def _ke_chains(code: str) -> list[list[str]]:
    """Every attribute chain that starts at `ke` (`ke.datasets.make_dataset` -> its names)."""
    chains = []
    for node in ast.walk(ast.parse(code)):
        names = []
        while isinstance(node, ast.Attribute):
            names.insert(0, node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id == "ke" and names:
            chains.append(names)
    return chains


def test_the_quick_start_is_on_the_first_screen_offline_and_public():
    code, last_line = quick_start()
    assert last_line <= FIRST_SCREEN_LINES, last_line
    assert "import keras_efficientnet as ke" in code
    assert "imagenet" not in code  # weights="imagenet" needs the network
    chains = _ke_chains(code)
    assert ["EfficientNet", "from_preset"] in chains and ["datasets", "make_dataset"] in chains
    for chain in chains:
        assert chain[0] in dir(ke), chain  # the package face lists every public name
        module = f"keras_efficientnet.{chain[0]}"
        if len(chain) > 1 and importlib.util.find_spec(module):  # a face (ke.datasets): its
            assert chain[1] in dir(importlib.import_module(module)), chain  # names, unloaded


@pytest.mark.slow
@pytest.mark.tf_only
def test_the_quick_start_runs_as_pasted(tmp_path):
    code, _ = quick_start()
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
               KERAS_EFFICIENTNET_DATA_DIR=str(tmp_path / "data"))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    # The MAC count its comment promises, printed (B0 G16-LN+PN at 224 px; the preset table's
    # 0.636 G).
    assert "636340032" in done.stdout.split(), done.stdout[-2000:]
    assert (tmp_path / "digits.keras").is_file()
    assert (tmp_path / "data" / "digits" / "train").is_dir()  # written fresh, offline
