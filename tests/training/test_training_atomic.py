"""The one atomic-write helper: the old file or the new one, never a part or a stray temp."""

import pytest

from keras_efficientnet.atomic import atomic_file, write_atomically


def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "deeper" / "results.json"
    assert write_atomically(path, "first") == path
    write_atomically(path, "second")
    assert path.read_text() == "second"
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "LATEST"
    write_atomically(path, "epoch-0001")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_file(path) as tmp:
            tmp.write_text("epo")
            raise RuntimeError("disk full")
    assert path.read_text() == "epoch-0001"
    assert [p.name for p in tmp_path.iterdir()] == ["LATEST"]
