"""The mode table (issue 34 point 5): what each --mode does, looked up instead of tested by name."""

import ast
import re
from pathlib import Path

import pytest

from keras_efficientnet.training import run_dir
from keras_efficientnet.training.config import TrainConfig
from keras_efficientnet.training.modes import MODE_TABLE, MODES

PACKAGE = Path(__file__).resolve().parents[2] / "keras_efficientnet"


def test_each_mode_row_says_what_the_mode_does():
    # (trains, finetunes, scores_only, results file), as docs/architecture.md describes them.
    assert {name: (m.trains, m.finetunes, m.scores_only, run_dir.results_name(name))
            for name, m in MODE_TABLE.items()} == {
        "train": (True, False, False, "results.json"),
        "evaluate": (False, False, True, "results-evaluate.json"),
        "finetune": (False, True, False, "results-finetune.json"),
        "train_and_finetune": (True, True, False, "results.json"),
    }


def test_the_mode_flag_takes_the_table_and_its_help_names_every_mode():
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(TrainConfig)}["mode"]
    assert tuple(field.metadata["choices"]) == MODES == tuple(MODE_TABLE)
    for name, mode in MODE_TABLE.items():
        assert f"{name} = {mode.help}" in field.metadata["help"]
    with pytest.raises(ValueError, match=r"--mode='trian' is not valid; choose one of "
                                         r"\['train', 'evaluate', 'finetune'"):
        TrainConfig(mode="trian")


def test_the_table_is_plain_python():
    tree = ast.parse((PACKAGE / "training" / "modes.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names} | {node.module for node in ast.walk(tree)
                                            if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses"}


# A test of the mode's name: `mode == "..."`, `mode in (...)`, `mode.endswith(...)`.
NAME_TEST = re.compile(r"\bmode\s*(==|!=|not in|in)\s*[\"'(]|\bmode\.(endswith|startswith)\(")


def test_no_module_tests_the_mode_by_name():
    found = [f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
             for path in PACKAGE.rglob("*.py")
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if NAME_TEST.search(line)]
    assert found == []
    assert NAME_TEST.search('if config.mode in ("train", "x"):')  # the pattern finds one
