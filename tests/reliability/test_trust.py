"""The run directory as a trust boundary (issue 21): nothing written through a link, every
checkpoint name inside the run, checkpoints verified against their manifest before use, refused
writes named with the free space and the fix, nothing group- or world-writable, no secrets in
run.lock."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from keras_efficientnet import atomic
from keras_efficientnet.cli import errors
from keras_efficientnet.training import run_dir
from keras_efficientnet.training.checkpoint import (
    MANIFEST,
    CheckpointManager,
    CheckpointWriteError,
    NoIntactCheckpointError,
    verify,
)
from keras_efficientnet.training.config import TrainConfig
from tests.helpers import tiny_sgd_model

pytestmark = pytest.mark.tf_only


def _model(seed=0):
    return tiny_sgd_model(seed, built=True)


def _checkpoints(directory: Path, epochs=(1, 2), **kwargs) -> CheckpointManager:
    manager = CheckpointManager(directory, keep=10)
    model = _model()
    for epoch in epochs:
        manager.save(epoch, model, model.optimizer, state={"global_step": epoch},
                     average=[np.full(3, epoch, np.float32)], **kwargs)
    return manager


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "keras_efficientnet"]


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "someone-elses.txt"
    victim.write_text("precious\n")
    return victim


# 1. Nothing written through a link.

def test_a_link_at_run_lock_is_refused_and_its_target_untouched(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    victim = _victim(tmp_path)
    (run / "run.lock").symlink_to(victim)
    with pytest.raises(run_dir.RunDirError) as raised:
        run_dir.RunLock(run).acquire()
    assert str(raised.value) == (
        f"{run / 'run.lock'} is a symbolic link (to {str(victim)!r}), not a regular file: the "
        "lock is never taken through a link; remove it or give another --model_dir")
    assert victim.read_text() == "precious\n"
    assert errors.describe(raised.value)[1] == 2


def test_a_fifo_at_run_lock_is_refused(tmp_path):
    os.mkfifo(tmp_path / "run.lock")
    with pytest.raises(run_dir.RunDirError,
                       match=r"run.lock is a named pipe \(FIFO\), not a regular file"):
        run_dir.RunLock(tmp_path).acquire()


@pytest.mark.parametrize("name", ["LATEST", "results.json", "class_names.json"])
def test_a_link_at_a_file_the_run_writes_is_refused(tmp_path, name):
    victim = _victim(tmp_path)
    (tmp_path / name).symlink_to(victim)
    with pytest.raises(atomic.UnsafePathError) as raised:
        atomic.write_atomically(tmp_path / name, "x")
    assert str(raised.value) == (
        f"{tmp_path / name} is a symbolic link (to {str(victim)!r}), not a regular file: the "
        "run writes only its own regular files and never through a link; remove it or give "
        "another --model_dir")
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, victim.name])


def test_a_link_at_model_keras_is_refused(tmp_path):
    from keras_efficientnet.training.export import save_model

    victim = _victim(tmp_path)
    (tmp_path / "model.keras").symlink_to(victim)
    with pytest.raises(atomic.UnsafePathError, match="model.keras is a symbolic link"):
        save_model(_model(), tmp_path)
    assert victim.read_text() == "precious\n"


def test_a_link_at_checkpoints_is_refused_before_any_work(tmp_path):
    other = tmp_path / "other-run-checkpoints"
    other.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(other)
    config = TrainConfig(model_dir=str(run), resume=True)
    with pytest.raises(atomic.UnsafePathError, match="checkpoints is a symbolic link"):
        with run_dir.owned(config):
            pass
    assert not (run / "run.lock").exists()


@pytest.mark.parametrize("name,mode", [("metrics.csv", "train"), ("config.json", "train"),
                                       ("best.json", "train"), ("best.keras", "train"),
                                       ("results.json", "train"),
                                       ("results-evaluate.json", "evaluate")])
@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_every_run_file_is_checked_when_the_run_takes_its_directory(tmp_path, name, mode,
                                                                    kind):
    # Before the first epoch (metrics.csv failed only after a whole one, a pipe hung the run).
    import signal

    run = tmp_path / "run"
    run.mkdir()
    victim = _victim(tmp_path)
    path = run / name
    {"symlink": lambda: path.symlink_to(victim), "fifo": lambda: os.mkfifo(path),
     "directory": path.mkdir}[kind]()
    signal.alarm(10)  # a blocked open fails (SIGALRM) instead of hanging the suite
    try:
        with pytest.raises(atomic.UnsafePathError) as raised:
            with run_dir.owned(TrainConfig(model_dir=str(run), resume=True, mode=mode)):
                pass
    finally:
        signal.alarm(0)
    found = {"symlink": "a symbolic link", "fifo": "a named pipe (FIFO)",
             "directory": "a directory"}[kind]
    assert str(raised.value).startswith(f"{path} is {found}")
    assert errors.describe(raised.value)[1] == 2
    assert victim.read_text() == "precious\n"


# 2. Everything resolves inside the run; "diverged" only from the manifest.

def test_latest_pointing_into_another_run_is_ignored_in_one_line(tmp_path, caplog):
    other = _checkpoints(tmp_path / "other", epochs=(1, 2, 3, 4))
    mine = _checkpoints(tmp_path / "mine", epochs=(1, 2))
    (mine.directory / "LATEST").write_text("../../other/epoch-0004")
    with caplog.at_level(logging.WARNING, "keras_efficientnet"):
        assert mine.resume_point() == mine.directory / "epoch-0002"
    assert _lines(caplog) == [
        f"{mine.directory / 'LATEST'} is naming '../../other/epoch-0004', which is not a "
        f"checkpoint of {mine.directory}: moved to {mine.directory / 'damaged' / 'LATEST'}; "
        "resuming from the newest intact checkpoint of this run"]
    assert other.resume_point() == other.directory / "epoch-0004"  # untouched


def test_a_checkpoint_linked_from_another_run_is_moved_aside(tmp_path, caplog):
    other = _checkpoints(tmp_path / "other", epochs=(1, 2, 3, 4))
    mine = _checkpoints(tmp_path / "mine", epochs=(1, 2))
    (mine.directory / "epoch-0004").symlink_to(other.directory / "epoch-0004")
    (mine.directory / "LATEST").unlink()
    (mine.directory / "LATEST").symlink_to(other.directory / "LATEST")
    with caplog.at_level(logging.WARNING, "keras_efficientnet"):
        assert mine.resume_point() == mine.directory / "epoch-0002"
    lines = _lines(caplog)
    assert lines[0].startswith(f"{mine.directory / 'LATEST'} is a symbolic link (to ")
    assert lines[1] == (
        f"checkpoint {mine.directory / 'epoch-0004'} is damaged: it is a link to "
        f"{other.directory / 'epoch-0004'}, outside {mine.directory}; moved to "
        f"{mine.directory / 'damaged' / 'epoch-0004'}, trying the previous one")
    assert len(lines) == 2
    assert (other.directory / "epoch-0004" / MANIFEST).is_file()  # the link moved, not this


def test_an_older_latest_does_not_make_a_newer_healthy_checkpoint_diverged(tmp_path, caplog):
    manager = _checkpoints(tmp_path, epochs=(1, 2, 3))
    (tmp_path / "LATEST").write_text("epoch-0001")  # as if a crash came before its update
    with caplog.at_level(logging.WARNING, "keras_efficientnet"):
        assert manager.resume_point() == tmp_path / "epoch-0003"
    assert not _lines(caplog)


def test_diverged_comes_from_the_manifest(tmp_path, caplog):
    manager = _checkpoints(tmp_path, epochs=(1, 2))
    _checkpoints(tmp_path, epochs=(3, 4), healthy=False)
    with caplog.at_level(logging.WARNING, "keras_efficientnet"):
        assert manager.resume_point() == tmp_path / "epoch-0002"
    assert _lines(caplog) == [
        "not resuming from epoch-0003, epoch-0004: written while the loss looked diverged "
        f"(their manifests say so); resuming from the last good checkpoint "
        f"{tmp_path / 'epoch-0002'}"]


# 3. Checkpoints verified before use.

def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flip":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    else:
        path.unlink()


def test_the_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    import hashlib

    manager = _checkpoints(tmp_path, epochs=(3,), batch=7)
    folder = tmp_path / "epoch-0003-batch-000007"
    manifest = json.loads((folder / MANIFEST).read_text())
    assert (manifest["epoch"], manifest["batch"], manifest["healthy"]) == (3, 7, True)
    names = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST)
    assert sorted(manifest["files"]) == names
    assert {"model.weights.h5", "optimizer.npz", "average.npz", "rng.npz", "state.json"} <= set(
        names)
    for name in names:
        data = (folder / name).read_bytes()
        assert manifest["files"][name] == {"size": len(data),
                                           "sha256": hashlib.sha256(data).hexdigest()}
    assert verify(folder) is None and manager.resume_point() == folder


@pytest.mark.parametrize("how", ["truncate", "flip", "delete"])
@pytest.mark.parametrize("name", ["model.weights.h5", "optimizer.npz", "average.npz", "rng.npz",
                                  "state.json", MANIFEST])
def test_a_damaged_file_moves_the_newest_checkpoint_aside_in_one_line(tmp_path, caplog, name,
                                                                       how):
    manager = _checkpoints(tmp_path, epochs=(1, 2))
    newest = tmp_path / "epoch-0002"
    _damage(newest / name, how)
    with caplog.at_level(logging.WARNING, "keras_efficientnet"):
        assert manager.resume_point() == tmp_path / "epoch-0001"
    [line] = _lines(caplog)
    assert line.startswith(f"checkpoint {newest} is damaged: {name}")
    assert line.endswith(f"; moved to {tmp_path / 'damaged' / 'epoch-0002'}, trying the "
                         "previous one")
    assert not newest.exists() and (tmp_path / "damaged" / "epoch-0002").is_dir()
    assert name in line


def test_an_added_file_is_damage_too(tmp_path, caplog):
    manager = _checkpoints(tmp_path, epochs=(1, 2))
    (tmp_path / "epoch-0002" / "extra.pkl").write_bytes(b"x")
    assert manager.resume_point() == tmp_path / "epoch-0001"


def test_no_intact_checkpoint_names_what_was_found(tmp_path, caplog):
    manager = _checkpoints(tmp_path, epochs=(1, 2))
    _damage(tmp_path / "epoch-0001" / "model.weights.h5", "truncate")
    (tmp_path / "epoch-0002" / "state.json").write_text("{")
    with pytest.raises(NoIntactCheckpointError) as raised, caplog.at_level(logging.WARNING):
        manager.resume_point()
    assert not _lines(caplog)  # the one error line says it all
    line = str(raised.value)
    assert line.startswith(f"no intact checkpoint in {tmp_path}: found epoch-0002 (state.json "
                           "has 1 bytes, the manifest says ")
    assert "; epoch-0001 (model.weights.h5 has " in line
    assert line.endswith(f"moved to {tmp_path / 'damaged'}. Rerun with --noresume to start "
                         "afresh (or restore a checkpoint from a backup)")
    assert sorted(os.listdir(tmp_path / "damaged")) == ["epoch-0001", "epoch-0002"]
    assert errors.describe(raised.value)[1] == 2


def test_evaluation_skips_damage_without_moving_it(tmp_path):
    manager = _checkpoints(tmp_path, epochs=(1, 2))
    _damage(tmp_path / "epoch-0002" / "optimizer.npz", "flip")
    assert manager.resume_point(move_damaged=False) == tmp_path / "epoch-0001"
    assert (tmp_path / "epoch-0002").is_dir() and not (tmp_path / "damaged").exists()


# 8. Refused writes: the file, the free space, the fix; nothing half-written.

@pytest.mark.parametrize("code,fix", [
    (errno.ENOSPC, "free space (or raise the quota, or give a --model_dir on another disk), "
                   "then rerun the same command"),
    (errno.EACCES, "give this user write permission on {dir} (or another --model_dir), then "
                   "rerun the same command"),
])
def test_a_refused_write_names_the_file_the_free_space_and_the_fix(tmp_path, monkeypatch, code,
                                                                   fix):
    path = tmp_path / "results.json"
    path.write_text("old")
    real_replace = os.replace

    def refuse(src, dst):
        if Path(dst) == path:
            raise OSError(code, os.strerror(code))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(atomic.WriteError) as raised:
        atomic.write_atomically(path, "new")
    free = shutil.disk_usage(tmp_path).free / 2**30
    assert str(raised.value) == (
        f"could not write {path}: {os.strerror(code)} ({free:.1f} GiB free there); nothing "
        f"half-written was left. Fix: {fix.format(dir=tmp_path)}")
    assert os.listdir(tmp_path) == ["results.json"] and path.read_text() == "old"
    assert errors.describe(raised.value) == (f"error: {raised.value}", 1)


def test_a_refused_run_lock_write_names_the_lock(tmp_path, monkeypatch):
    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(atomic.WriteError, match=rf"could not write {tmp_path / 'run.lock'}: No "
                                                r"space left on device \(.* free there\)"):
        run_dir.RunLock(tmp_path).acquire()


def test_a_model_file_refused_half_way_leaves_nothing(tmp_path, monkeypatch):
    from keras_efficientnet.training.export import save_model

    model = _model()

    def disk_full(path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model, "save", disk_full)
    with pytest.raises(atomic.WriteError, match=r"could not write .*model\.keras: No space left "
                                                r"on device \(.* free there\)"):
        save_model(model, tmp_path)
    assert os.listdir(tmp_path) == []


# 10. Nothing group- or world-writable whatever the umask; no secrets in run.lock.

def test_nothing_the_run_writes_is_group_or_world_writable_under_umask_000(tmp_path):
    run = tmp_path / "run"
    config = TrainConfig(model_dir=str(run), resume=True)
    previous = os.umask(0)
    try:
        with run_dir.owned(config):
            manager = _checkpoints(run / "checkpoints", epochs=(1,))
            atomic.write_atomically(run / "results.json", "{}")
            (run / "logs" / "train").mkdir(parents=True)
            with open(run / "logs" / "train" / "events", "w") as f:  # as TensorBoard writes
                f.write("x")
            assert manager.latest() is not None
            lock_mode = (run / "run.lock").stat().st_mode
        assert os.umask(0) == 0  # the caller's umask is given back
    finally:
        os.umask(previous)
    found = [run, *run.rglob("*")]
    writable = [str(p) for p in found if p.stat().st_mode & 0o022]
    assert len(found) > 8 and not writable
    assert not lock_mode & 0o022 and stat.S_ISREG(lock_mode)


@pytest.mark.parametrize("argv,shown", [
    (["--api_token=abc", "--epochs=2"], ["--api_token=***", "--epochs=2"]),
    (["--wandb_key", "k1", "--noresume"], ["--wandb_key", "***", "--noresume"]),
    (["-SECRET_id=s", "--Password=p", "--keep_checkpoints=3"],
     ["-SECRET_id=***", "--Password=***", "--keep_checkpoints=3"]),
    (["--model_dir=runs/token-run"], ["--model_dir=runs/token-run"]),
])
def test_run_lock_redacts_the_values_of_secret_flags(tmp_path, monkeypatch, argv, shown):
    monkeypatch.setattr("sys.orig_argv", ["python", "-m", "keras_efficientnet.train", *argv])
    lock = run_dir.RunLock(tmp_path)
    lock.acquire()
    try:
        record = json.loads((tmp_path / "run.lock").read_text())
    finally:
        lock.release()
    assert record["command"] == " ".join(["python", "-m", "keras_efficientnet.train", *shown])


def test_a_checkpoint_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch):
    # A write that fills the disk part-way leaves HDF5 holding a file it cannot flush (the
    # process then crashes at exit): the space is checked first.
    manager = _checkpoints(tmp_path, epochs=(1,))
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: usage._replace(free=512 * 1024))
    with pytest.raises(CheckpointWriteError) as raised:
        manager.save(2, _model())
    assert str(raised.value).startswith(
        f"could not write checkpoint {tmp_path / 'epoch-0002'}: No space left on device (the "
        "write needs about 1.0 MiB) (512.0 KiB free there); the last checkpoint "
        f"{tmp_path / 'epoch-0001'} is intact. Fix: free space")
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "epoch-0001"]
