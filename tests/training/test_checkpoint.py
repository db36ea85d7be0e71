"""training.checkpoint: names by position, rotation that keeps the last good one, the random-
generator state, refused writes."""

from __future__ import annotations

import errno
import os
import shutil

import keras
import numpy as np
import pytest

from keras_efficientnet.training.checkpoint import (
    CheckpointManager,
    CheckpointWriteError,
    checkpoint_name,
    position_of,
)
from tests.helpers import tiny_sgd_model

pytestmark = pytest.mark.tf_only


def _model(seed=0):
    return tiny_sgd_model(seed)


def test_names_sort_by_position_mid_epoch_saves_included(tmp_path):
    manager = CheckpointManager(tmp_path, keep=10)
    model = _model()
    for epoch, batch in [(1, 0), (0, 3), (1, 2), (2, 0), (0, 0)]:
        manager.save(epoch, model, batch=batch)
    assert [p.name for p in manager.all()] == [
        "epoch-0000", "epoch-0000-batch-000003", "epoch-0001", "epoch-0001-batch-000002",
        "epoch-0002"]
    assert position_of(tmp_path / checkpoint_name(3, 17)) == (3, 17)
    assert position_of(tmp_path / "epoch-0003.bak") is None


def test_rotation_never_drops_the_last_good_checkpoint(tmp_path):
    # The case: epochs 1-2 good, then three saves while the loss was diverged, keeping
    # the newest 2: epoch 2 survives (and LATEST names it), the diverged ones are kept to look at.
    manager = CheckpointManager(tmp_path, keep=2)
    model = _model()
    for epoch in (1, 2):
        manager.save(epoch, model, state={"global_step": epoch})
    for epoch in (3, 4, 5):
        manager.save(epoch, model, healthy=False)
    assert [p.name for p in manager.all()] == ["epoch-0002", "epoch-0004", "epoch-0005"]
    assert manager.latest().name == "epoch-0002"
    assert (tmp_path / "LATEST").read_text() == "epoch-0002"
    (tmp_path / "LATEST").unlink()  # without the pointer, the newest healthy one still wins
    assert manager.latest().name == "epoch-0002"
    manager.save(6, model)  # a good save again: it becomes the latest, epoch 2 may go
    assert [p.name for p in manager.all()] == ["epoch-0005", "epoch-0006"]


def test_random_generator_state_round_trips_so_resumed_masks_match(tmp_path):
    x = np.ones((64, 4), "float32")
    model = _model(seed=1)
    model(x, training=True)  # advances the dropout generator
    path = CheckpointManager(tmp_path).save(1, model, model.optimizer)
    expected = keras.ops.convert_to_numpy(model(x, training=True))  # the next mask

    fresh = _model(seed=2)  # another seed: another initial generator state
    fresh.optimizer.build(fresh.trainable_variables)
    CheckpointManager.restore(path, fresh, fresh.optimizer)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(fresh(x, training=True)), expected)
    # Evaluation loads (no optimizer) leave the generators alone.
    other = _model(seed=2)
    before = [keras.ops.convert_to_numpy(v) for v in other.variables if "seed" in v.path]
    CheckpointManager.restore(path, other)
    after = [keras.ops.convert_to_numpy(v) for v in other.variables if "seed" in v.path]
    np.testing.assert_array_equal(before, after)


def test_a_refused_write_names_the_checkpoint_and_leaves_no_partial_folder(tmp_path,
                                                                          monkeypatch):
    model = _model()
    manager = CheckpointManager(tmp_path)
    manager.save(1, model)

    def disk_full(path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(model, "save_weights", disk_full)
    with pytest.raises(CheckpointWriteError) as raised:
        manager.save(2, model)
    assert raised.value.errno == errno.ENOSPC
    free = shutil.disk_usage(tmp_path).free / 2**30
    assert str(raised.value) == (
        f"could not write checkpoint {tmp_path / 'epoch-0002'}: No space left on device "
        f"({free:.1f} GiB free there); the last checkpoint {tmp_path / 'epoch-0001'} is "
        "intact. Fix: free space (or raise the quota, or give a --model_dir on another disk), "
        "then rerun the same command to resume")
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "epoch-0001"]


def test_the_best_copy_survives_rotation_is_verified_and_is_never_resumed(tmp_path):
    from keras_efficientnet.training.checkpoint import BEST, WEIGHTS, verify

    manager = CheckpointManager(tmp_path, keep=1)
    model = _model()
    first = manager.save(1, model, average=[np.full(3, 0.25)])
    expected = [w.copy() for w in model.get_weights()]
    assert manager.keep_best(first) == tmp_path / BEST
    model.set_weights([w + 1.0 for w in expected])
    manager.save(2, model)
    manager.save(3, model)
    assert sorted(os.listdir(tmp_path)) == ["LATEST", BEST, "epoch-0003"]  # epoch-0001 rotated
    assert manager.verify_best(1) is None and verify(tmp_path / BEST, position=(1, 0)) is None
    assert "written for epoch 1 batch 0" in manager.verify_best(3)  # checked against the epoch
    assert manager.resume_point() == tmp_path / "epoch-0003"
    restored = _model(seed=1)
    state = CheckpointManager.restore(tmp_path / BEST, restored)
    assert state["epoch"] == 1 and np.array_equal(state["average"][0], np.full(3, 0.25))
    for got, want in zip(restored.get_weights(), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    # A new best replaces it whole; damage done in place to the source does not reach it.
    manager.keep_best(tmp_path / "epoch-0003")
    with open(tmp_path / "epoch-0003" / WEIGHTS, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    assert manager.verify_best(3) is None
    assert "SHA-256" in verify(tmp_path / "epoch-0003")
    with open(tmp_path / BEST / WEIGHTS, "ab") as f:
        f.write(b"x")
    assert "bytes" in manager.verify_best(3)
    assert not [p for p in os.listdir(tmp_path) if p.startswith((".tmp-", ".trash-"))]


def test_keep_best_reads_the_source_once_and_refuses_a_damaged_or_linked_one(tmp_path,
                                                                          monkeypatch):
    from keras_efficientnet.runs import manifest  # where a checkpoint's files are hashed
    from keras_efficientnet.training.checkpoint import BEST, WEIGHTS, verify

    manager = CheckpointManager(tmp_path, keep=5)
    first = manager.save(1, _model())
    hashed = []
    sha256 = manifest._sha256
    monkeypatch.setattr(manifest, "_sha256", lambda path: hashed.append(path) or sha256(path))
    manager.keep_best(first)
    assert hashed == []  # hashed while copying: no separate read to verify
    monkeypatch.undo()
    assert verify(tmp_path / BEST, position=(1, 0)) is None
    copied = (tmp_path / BEST / WEIGHTS).read_bytes()
    second = manager.save(2, _model(seed=1))
    with open(second / WEIGHTS, "r+b") as f:  # changed after save() wrote its manifest
        f.seek(100)
        f.write(b"\xff\xfe")
    with pytest.raises(ValueError, match=r"model\.weights\.h5 does not match its SHA-256"):
        manager.keep_best(second)
    (second / WEIGHTS).unlink()
    (second / WEIGHTS).symlink_to(first / WEIGHTS)
    with pytest.raises(ValueError, match="not a regular file"):
        manager.keep_best(second)
    assert (tmp_path / BEST / WEIGHTS).read_bytes() == copied  # the previous best stands
    assert not [p for p in os.listdir(tmp_path) if p.startswith((".tmp-", ".trash-"))]
