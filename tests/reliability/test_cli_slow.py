"""The training command driven as a user would, in subprocesses: signals, kill -9 during saves,
two runs on one directory, the fresh-run rule, divergence and every one-line error.

Slow (each run loads TensorFlow and builds the model): `make test-slow`.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from absl import flags

from keras_efficientnet.cli.flags import config_from_flags, define_flags
from keras_efficientnet.training import trainer
from keras_efficientnet.training.checkpoint import CheckpointManager, position_of
from tests.reliability.clitools import (
    REPO,
    TINY,
    assert_one_line,
    assert_same_checkpoint,
    cli_command,
    env,
    messages,
    run_cli,
    start_cli,
    stop,
    wait_for,
    write_unreadable_folder,
)

pytestmark = [pytest.mark.slow, pytest.mark.tf_only]

# 3 epochs of 8 steps; every run below that trains uses exactly these settings, so that its
# final checkpoint must equal the uninterrupted reference's bit for bit.
SHAPE = ["--epochs=3", "--updates_per_epoch=8"]
FINAL = "epoch-0003"


class Reference:
    """The uninterrupted run, and a second run started on its directory while it ran."""

    def __init__(self, root: Path):
        self.model_dir = root / "reference"
        process = start_cli(*TINY, *SHAPE, f"--model_dir={self.model_dir}")
        wait_for(lambda: (self.model_dir / "run.lock").is_file(), 300, "the lock", process)
        time.sleep(2)  # as in the issue: the second run 2 s after the first
        self.second = run_cli(*TINY, *SHAPE, f"--model_dir={self.model_dir}", timeout=120)
        self.pid = process.pid
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        self.final = self.model_dir / "checkpoints" / FINAL
        self.results = json.loads((self.model_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return Reference(tmp_path_factory.mktemp("reliability"))


def test_a_second_run_on_a_busy_directory_fails_at_once_and_the_first_owns_it(reference):
    assert_one_line(reference.second, 2, rf"is in use by another run \(pid {reference.pid} ")
    assert reference.results["checkpoint"] == str(reference.final)
    state = CheckpointManager.read_state(reference.final)
    assert (state["epoch"], state["global_step"]) == (3, 24)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_checkpoints_the_step_and_the_same_command_resumes_bit_exactly(
        tmp_path, reference, signum):
    model_dir = tmp_path / "run"
    args = [*TINY, *SHAPE, "--checkpoint_steps=3", f"--model_dir={model_dir}"]
    process = start_cli(*args)
    first = model_dir / "checkpoints" / "epoch-0000-batch-000003"
    wait_for(first.is_dir, 600, "the step-3 checkpoint", process)
    status, _, err = stop(process, signum)
    assert "Traceback" not in err
    line = messages(err)[-1]
    assert status == 128 + signum, err[-3000:]
    assert line.startswith(f"stopped by {signal.Signals(signum).name} after step "), line
    saved = Path(line.split("checkpoint written to ")[1].split(";")[0])
    state = CheckpointManager.read_state(saved)
    assert position_of(saved) == (state["epoch"], state["batch"]) >= (0, 3)
    print(f"{signal.Signals(signum).name} stopped at {saved.name}")

    resumed = run_cli(*args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {saved}" in resumed.stderr
    assert_same_checkpoint(model_dir / "checkpoints" / FINAL, reference.final)
    results = json.loads((model_dir / "results.json").read_text())
    assert results["history"] == reference.results["history"]


def _config(args):
    values = flags.FlagValues()
    define_flags(values)
    values(["train", *args])
    return config_from_flags(values)


def test_kill_9_during_saves_always_leaves_a_loadable_latest_checkpoint(tmp_path, reference,
                                                                       monkeypatch):
    monkeypatch.chdir(REPO)  # the flagfile path is relative
    model_dir = tmp_path / "run"
    args = [*TINY, *SHAPE, "--checkpoint_steps=1", "--keep_checkpoints=2",
            f"--model_dir={model_dir}"]
    config = _config(args)
    model = trainer.build_model(config, 32, 10)  # to load each latest checkpoint into
    schedule = trainer.lr_schedule(config, 8, config.epochs, config.peak_learning_rate())
    trainer.compile_model(model, trainer.build_optimizer(config, schedule), config, 10)
    manager = CheckpointManager(model_dir / "checkpoints")
    saving = lambda: any(p.name.startswith(".tmp-")
                         for p in manager.directory.glob(".*"))
    chance = random.Random(12)
    kills, in_save, positions = 0, 0, []
    while kills < 10:
        start = manager.latest()
        process = start_cli(*args)
        wait_for(lambda start=start: manager.latest() != start, 600, "a new checkpoint",
                 process)
        if kills % 2:  # odd kills: the moment a save is seen in progress
            deadline = time.monotonic() + 30
            while not saving() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            in_save += saving()
        else:  # even kills: any moment (a step, a save, between the two)
            time.sleep(chance.uniform(0.0, 0.4))
        if process.poll() is not None:
            pytest.fail(f"the run ended before kill {kills + 1}: lower its speed or add steps")
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
        kills += 1
        state = CheckpointManager.restore(manager.latest(), model, model.optimizer)
        positions.append((state["epoch"], state["batch"]))
    assert positions == sorted(positions), positions  # never a step back
    print(f"{kills} kills, {in_save} during a save; positions {positions}")
    assert in_save >= 3
    finished = run_cli(*args)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_checkpoint(manager.directory / FINAL, reference.final)
    assert not [p for p in manager.directory.iterdir() if p.name.startswith(".")]


def test_a_fresh_run_never_mixes_with_the_earlier_one(tmp_path):
    model_dir = tmp_path / "smoke"
    first = run_cli("--flagfile=flags/smoke.flags", f"--model_dir={model_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    first_results = (model_dir / "results.json").read_text()
    second = run_cli("--flagfile=flags/smoke.flags", f"--model_dir={model_dir}")  # --noresume
    assert second.returncode == 0, second.stderr[-3000:]
    (previous,) = (model_dir / "previous").iterdir()
    assert (previous / "results.json").read_text() == first_results
    assert [p.name for p in CheckpointManager(previous / "checkpoints").all()] == ["epoch-0001"]
    results = json.loads((model_dir / "results.json").read_text())
    assert results["checkpoint"] == str(model_dir / "checkpoints" / "epoch-0001")
    assert CheckpointManager(model_dir / "checkpoints").latest() == Path(results["checkpoint"])


def test_a_finite_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    model_dir = tmp_path / "run"
    common = ["--flagfile=flags/smoke.flags", "--mode=train", "--optimizer=rmsprop",
              f"--model_dir={model_dir}", "--keep_checkpoints=1"]
    good = run_cli(*common, "--learning_rate=0.001", "--epochs=1")
    assert good.returncode == 0, good.stderr[-3000:]
    results = (model_dir / "results.json").read_text()
    # The command, resuming from that run: loss about 1e16, finite.
    diverged = run_cli(*common, "--resume", "--learning_rate=1e6", "--epochs=6")
    assert_one_line(diverged, 1, r"^error: training diverged: the loss \(.*e\+\d\d, running mean",
                    rf"the last good checkpoint {model_dir}/checkpoints/epoch-0001 is intact")
    manager = CheckpointManager(model_dir / "checkpoints")
    assert manager.latest().name == "epoch-0001"
    assert (model_dir / "checkpoints" / "epoch-0001").is_dir()
    assert (model_dir / "results.json").read_text() == results  # not overwritten


def _limit_file_size():
    # Writes past 512 KiB fail with EFBIG (Python ignores SIGXFSZ): a disk that refuses the
    # first checkpoint (3 MB of weights) but not the small files before it.
    resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, 512 * 1024))


@pytest.mark.parametrize("case", ["nan", "disk", "unreadable", "tfds", "evaluate_unwritable"])
def test_failures_after_tensorflow_loads_print_one_line(tmp_path, case):
    model_dir = tmp_path / "run"
    extra, status, pattern, kwargs = {
        "nan": (["--optimizer=sgd", "--learning_rate=1e30", "--divergence_factor=0"], 1,
                r"^error: training loss became (nan|inf) at step \d+ \(epoch 1, batch \d\); no "
                r"good checkpoint exists", {}),
        # No validation: its best.keras would be the first write refused, not the checkpoint.
        "disk": (["--eval_every=0"], 1,
                 rf"^error: could not write checkpoint {model_dir}/checkpoints/epoch-0001:"
                 r" File too large", {"preexec_fn": _limit_file_size}),
        "unreadable": ([f"--dataset=folder:{write_unreadable_folder(tmp_path / 'bad')}"], 2,
                       r"^error: no readable images in folder:.*bad \(split 'train'\) \(6 skipped",
                       {}),
        "tfds": (["--dataset=tfds:mnist", f"--data_dir={tmp_path / 'tfds'}"], 2,
                 r"^error: tfds dataset 'mnist' is not prepared in", {}),
        "evaluate_unwritable": (["--mode=evaluate"], 2, r"is not writable", {}),
    }[case]
    if case == "evaluate_unwritable":
        model_dir = Path("/sys/kernel/keras-efficientnet-run")  # see test_cli_run_dir._unwritable
        if not Path("/sys/kernel").is_dir():
            pytest.skip("no /sys/kernel")
    result = run_cli("--flagfile=flags/smoke.flags", "--mode=train", f"--model_dir={model_dir}",
                     *extra, **kwargs)
    assert_one_line(result, status, pattern)
    if case == "disk":
        assert not list((model_dir / "checkpoints").iterdir())  # no partial folder left


def test_sigterm_stops_a_mirrored_run_on_more_replicas_than_cores(tmp_path):
    model_dir, log = tmp_path / "run", tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            cli_command("--flagfile=flags/smoke.flags", "--mode=train", "--strategy=mirrored",
                        "--replicas=3", "--micro_batch_size=4", f"--model_dir={model_dir}"),
            cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        warned = lambda: "warning: --replicas=3 runs 3 logical CPU devices on " in (
            log.read_text())
        wait_for(warned, 300, "the warning", process)
        time.sleep(2)  # somewhere in building the strategy, the model or the first steps
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=600)
    err = log.read_text()
    assert "Traceback" not in err and status == 143, err[-3000:]
    assert messages(err)[-1].startswith("stopped by SIGTERM"), err[-3000:]
    assert not (model_dir / "run.lock").exists()


def test_sigterm_mid_epoch_of_a_mirrored_run_resumes_bit_exactly(tmp_path):
    args = [*TINY, "--epochs=2", "--updates_per_epoch=6", "--strategy=mirrored", "--replicas=2",
            "--micro_batch_size=8", "--checkpoint_steps=2"]
    full = run_cli(*args, f"--model_dir={tmp_path / 'full'}")
    assert full.returncode == 0, full.stderr[-3000:]
    model_dir = tmp_path / "stopped"
    process = start_cli(*args, f"--model_dir={model_dir}")
    wait_for((model_dir / "checkpoints" / "epoch-0000-batch-000002").is_dir, 600,
             "the step-2 checkpoint", process)
    status, _, err = stop(process, signal.SIGTERM)
    assert status == 143 and "Traceback" not in err, err[-3000:]
    resumed = run_cli(*args, f"--model_dir={model_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_checkpoint(model_dir / "checkpoints" / "epoch-0002",
                           tmp_path / "full" / "checkpoints" / "epoch-0002")
    shutil.rmtree(tmp_path / "full")
