"""--export_dir is atomic (issue 21 item 7): written into a temporary sibling and renamed into
place; an earlier export of ours is replaced whole; any other non-empty directory is refused,
naming it; a refused write leaves the earlier export as it was."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_efficientnet import atomic
from keras_efficientnet.cli import errors
from keras_efficientnet.training import run_dir
from keras_efficientnet.training.config import TrainConfig
from keras_efficientnet.training.export import export_saved_model

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])


def _serve(export_dir: Path, x: np.ndarray) -> np.ndarray:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(export_dir))
    # The serving signature takes uint8 images (cast inside).
    signature = loaded.signatures["serving_default"]
    return np.asarray(signature(images=tf.constant(x.astype(np.uint8)))["output_0"])


def test_an_export_is_renamed_into_place_and_marked_as_ours(tmp_path, model):
    x = np.array([[0, 1, 2, 3], [255, 7, 9, 11]], np.float32)
    path = export_saved_model(model, tmp_path / "export")
    assert path == tmp_path / "export"
    assert (path / run_dir.EXPORT_MARK).is_file() and (path / "saved_model.pb").is_file()
    assert os.listdir(tmp_path) == ["export"]  # no temporary sibling left
    np.testing.assert_allclose(_serve(path, x), model.predict(x, verbose=0), rtol=1e-6)


def test_an_earlier_export_of_ours_is_replaced_whole(tmp_path, model):
    path = export_saved_model(model, tmp_path / "export")
    (path / "assets" / "stale.txt").parent.mkdir(exist_ok=True)
    (path / "assets" / "stale.txt").write_text("from the earlier export")
    (path / "variables" / "variables.data-00001-of-00002").write_bytes(b"stale shard")
    export_saved_model(model, path)
    assert not (path / "assets" / "stale.txt").exists()
    assert not (path / "variables" / "variables.data-00001-of-00002").exists()
    assert os.listdir(tmp_path) == ["export"]


def test_an_empty_directory_is_used(tmp_path, model):
    (tmp_path / "export").mkdir()
    export_saved_model(model, tmp_path / "export")
    assert (tmp_path / "export" / "saved_model.pb").is_file()


def test_a_non_empty_directory_that_is_not_ours_is_refused_naming_it(tmp_path, model):
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"jpeg")
    with pytest.raises(atomic.UnsafePathError) as raised:
        export_saved_model(model, other)
    assert str(raised.value) == (
        f"--export_dir={str(other)!r} is a non-empty directory that is not an export of this "
        "project (it holds cat.jpg): nothing is merged into it; give a new or empty directory, "
        "or an earlier --export_dir")
    assert os.listdir(other) == ["cat.jpg"] and os.listdir(tmp_path) == ["photos"]
    assert errors.describe(raised.value)[1] == 2


def test_a_foreign_export_dir_is_refused_before_any_work(tmp_path):
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"jpeg")
    config = TrainConfig(model_dir=str(tmp_path / "run"), export_dir=str(other))
    with pytest.raises(atomic.UnsafePathError, match="is a non-empty directory that is not"):
        with run_dir.owned(config):
            pass


def test_a_link_at_export_dir_is_refused(tmp_path, model):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "export").symlink_to(target)
    with pytest.raises(atomic.UnsafePathError, match="export is a symbolic link"):
        export_saved_model(model, tmp_path / "export")
    assert os.listdir(target) == []


def test_a_refused_export_keeps_the_earlier_one_and_leaves_no_temporary(tmp_path, model,
                                                                        monkeypatch):
    path = export_saved_model(model, tmp_path / "export")
    before = sorted(p.relative_to(path) for p in path.rglob("*"))

    def disk_full(directory, *args, **kwargs):
        (Path(directory) / "saved_model.pb").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model, "export", disk_full)
    with pytest.raises(atomic.WriteError) as raised:
        export_saved_model(model, path)
    assert str(raised.value).startswith(
        f"could not write the SavedModel {path}: No space left on device (")
    assert "free there); nothing half-written was left. Fix: free space" in str(raised.value)
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before
    assert os.listdir(tmp_path) == ["export"]
