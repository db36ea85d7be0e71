"""training.run_dir and training.session: the lock without flock, the fresh-run rule (nothing
deleted, nothing mixed), leftovers of interrupted saves, and the one session that owns the run
directory and the signals for a whole run. End-to-end cases: tests/reliability/."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from keras_efficientnet.training import TrainConfig, run_dir
from keras_efficientnet.training.run_dir import RunDirError, RunLock


def _config(model_dir, **changes):
    return TrainConfig(**{"model_dir": str(model_dir), "model": "efficientnet-tiny-g16-lnpn",
                          **changes})


def test_without_flock_a_dead_pid_on_this_host_is_stale_and_others_are_not(tmp_path,
                                                                            monkeypatch):
    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        cases = [({"host": socket.gethostname(), "pid": dead.pid}, None),
                 ({"host": socket.gethostname(), "pid": live.pid}, f"pid {live.pid}"),
                 ({"host": "elsewhere", "pid": live.pid}, "delete .*run.lock")]
        for record, refusal in cases:
            (tmp_path / "run.lock").write_text(json.dumps(record))
            lock = RunLock(tmp_path)
            if refusal:
                with pytest.raises(RunDirError, match=refusal):
                    lock.acquire()
            else:
                assert lock.acquire()["pid"] == dead.pid
                lock.release()
    finally:
        live.kill()
        live.wait(timeout=60)


def _earlier_run(model_dir: Path) -> dict[str, str]:
    """The files an earlier run leaves, plus a user's note; returns {relative path: content}."""
    files = {"checkpoints/epoch-0006/state.json": '{"epoch": 6}',
             "checkpoints/LATEST": "epoch-0006",
             "logs/train/events.out": "events",
             "results.json": '{"top1": 0.9}',
             "results-evaluate.json": '{"top1": 0.8}',
             "finetuned.weights.h5": "weights",
             "notes.txt": "mine"}
    for name, text in files.items():
        (model_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / name).write_text(text)
    return files


@pytest.mark.parametrize("mode,resume,moved", [
    ("train", False, True), ("train_and_finetune", False, True), ("train", True, False),
    ("finetune", False, False), ("evaluate", False, False)])
def test_a_fresh_run_moves_the_earlier_run_aside_and_deletes_nothing(tmp_path, mode, resume,
                                                                     moved):
    files = _earlier_run(tmp_path)
    with run_dir.owned(_config(tmp_path, mode=mode, resume=resume)) as info:
        if mode != "evaluate":
            assert (tmp_path / "run.lock").is_file()
    assert not (tmp_path / "run.lock").exists()
    assert (info.moved_to is not None) == moved
    for name, text in files.items():
        if moved and name != "notes.txt":  # a user's file is not the run's: it stays
            assert (info.moved_to / name).read_text() == text
            assert not (tmp_path / name).exists()
        else:
            assert (tmp_path / name).read_text() == text
    if moved:
        assert info.moved_to.parent == tmp_path / "previous"
        assert any(f"moved the earlier run's files to {info.moved_to}" in note
                   for note in info.notes())


def test_leftovers_of_interrupted_saves_are_removed_at_start(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    for name in (".tmp-epoch-0003-ab12/model.weights.h5", ".trash-xy/epoch-0002/state.json",
                 "epoch-0002/state.json"):
        (checkpoints / name).parent.mkdir(parents=True, exist_ok=True)
        (checkpoints / name).write_text("{}")
    (checkpoints / ".LATEST.k3j4").write_text("epoch-0003")
    with run_dir.owned(_config(tmp_path)) as info:
        assert info.cleaned == 3
    assert sorted(os.listdir(checkpoints)) == ["epoch-0002"]


def test_one_session_owns_the_directory_and_the_signals_for_the_whole_run(tmp_path):
    from keras_efficientnet.training.session import RunSession

    config = _config(tmp_path, resume=False)
    _earlier_run(tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    with RunSession(config) as session:  # a multi-process run: the chief is not known yet
        assert session.run_dir is None and not (tmp_path / "run.lock").exists()
        assert signal.getsignal(signal.SIGTERM) == session.watch._handle
        first = session.claim_run_dir(True)  # the runtime has said: this process is the chief
        assert session.claim_run_dir(True) is first  # the trainer's claim inside the CLI's
        assert (tmp_path / "run.lock").is_file() and first.moved_to is not None
        with pytest.raises(RunDirError, match="in use by another run"):
            with RunSession(config, chief=True):  # a second run into the same directory
                pass
        with pytest.raises(RuntimeError, match="entered once"):
            session.__enter__()
    assert not (tmp_path / "run.lock").exists()
    assert signal.getsignal(signal.SIGTERM) == before
