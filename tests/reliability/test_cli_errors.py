"""One-line errors of the training command for the failures found after TensorFlow loads,
through its `main` in this process (the subprocess versions are in test_cli_slow.py)."""

from __future__ import annotations

import os

import keras
import pytest
from absl import flags

from keras_efficientnet.cli import train as cli
from keras_efficientnet.training import TrainConfig
from keras_efficientnet.training.checkpoint import CheckpointManager
from tests.reliability.clitools import REPO, messages

pytestmark = pytest.mark.tf_only


@pytest.fixture
def main(capsys, monkeypatch):
    """Runs the command's main with these flags; returns (status, its one message line)."""
    monkeypatch.chdir(REPO)

    def run(*argv):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["train", "--flagfile=flags/smoke.flags", *map(str, argv)])
        try:
            status = cli.main(["train"])
        finally:
            flags.FLAGS.unparse_flags()
        err = capsys.readouterr().err
        assert "Traceback" not in err
        lines = messages(err)
        assert len(lines) == 1, err
        return status, lines[0]

    return run


def _folder(root, classes=3):
    import numpy as np
    from PIL import Image

    for split in ("train", "validation"):
        for k in range(classes):
            (root / split / str(k)).mkdir(parents=True)
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / split / str(k) / "0.png")
    return root


def test_resuming_with_another_class_count_names_both_counts(tmp_path, main):
    run = tmp_path / "run"
    # What an earlier run on the digits (10 classes) left.
    earlier = TrainConfig(model="efficientnet-tiny-g16-lnpn", model_dir=str(run),
                          dataset="digits", drop_connect_rate=0.2, dropout_rate=-1.0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(10)])
    CheckpointManager(run / "checkpoints").save(
        1, model, state={"config": earlier.to_dict(), "num_classes": 10})
    source = f"folder:{_folder(tmp_path / 'photos')}"
    status, line = main(f"--model_dir={run}", "--resume", f"--dataset={source}")
    assert status == 2
    assert line == (f"error: the checkpoint in {run / 'checkpoints' / 'epoch-0001'} was trained "
                    f"on 10 classes but --dataset={source} has 3. Use another --model_dir, or "
                    "--noresume to start afresh (the earlier run is moved to "
                    "model_dir/previous/).")


@pytest.mark.parametrize("argv,pattern", [
    (["--dataset=tfrecord:{tmp}/shards-*"], "no TFRecord files match '.*/shards-\\*'"),
    (["--mode=evaluate"], "--mode=evaluate needs trained weights: no checkpoint in"),
    (["--mode=finetune", "--init_checkpoint={tmp}/none.weights.h5"],
     "--init_checkpoint='.*none.weights.h5': no such file or folder"),
])
def test_missing_inputs_found_after_tensorflow_loads_are_one_line(tmp_path, main, argv,
                                                                   pattern):
    import re

    status, line = main(f"--model_dir={tmp_path / 'run'}",
                        *[a.format(tmp=tmp_path) for a in argv])
    assert status == 2 and re.search(pattern, line), line
    assert not (tmp_path / "run" / "run.lock").exists()  # released


def test_more_logical_cpu_replicas_than_cores_warns():
    cores = len(os.sched_getaffinity(0))
    config = TrainConfig(strategy="mirrored", replicas=cores + 1)
    assert cli.cpu_oversubscription(config) == (
        f"--replicas={cores + 1} runs {cores + 1} logical CPU devices on {cores} CPU cores: they "
        f"take turns on the cores, so this is a functional run, far slower than "
        f"--replicas={cores} or fewer")
    assert cli.cpu_oversubscription(config.replace(replicas=cores)) is None
    assert cli.cpu_oversubscription(TrainConfig()) is None


def test_a_peer_that_stops_answering_is_one_line_and_run_failed():
    # TensorFlow's UnavailableError, recognised by name so that describing imports nothing.
    from keras_efficientnet.cli import errors

    unavailable = type("UnavailableError", (RuntimeError,), {})
    line, status = errors.describe(unavailable(
        "Collective ops is aborted by: failed to connect to all addresses\n"
        "Additional GRPC error information:\n:{created_time: ...}\n[[node x]]\nmore"))
    assert status == errors.RUN_FAILED == 1
    assert line.count("\n") == 0
    assert line.startswith("error: a peer of this multi-worker run stopped answering "
                           "(Collective ops is aborted by: failed to connect")
    assert "[4 more lines left out]" in line
    assert errors.describe(RuntimeError("a bug")) is None
