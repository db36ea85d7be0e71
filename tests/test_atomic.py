"""atomic.open_file: the one way the package opens a file (issue 36): never through a link,
never blocked on a named pipe, never a folder; every open of runs/, training/ and cli/ uses it."""

from __future__ import annotations

import ast
import os
import signal
from pathlib import Path

import pytest

from keras_efficientnet import atomic

PACKAGE = Path(atomic.__file__).parent


@pytest.fixture
def bounded():
    """A blocked open fails the test after 5 s instead of hanging the suite."""
    def fail(signum, frame):
        raise TimeoutError("blocked for 5 s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("mode", ["r", "rb", "a", "ab", "w", "wb", "rb+"])
@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_link_pipe_or_folder_is_refused_in_every_mode(tmp_path, bounded, mode, kind):
    path, victim = tmp_path / "file", tmp_path / "victim"
    victim.write_text("precious\n")
    {"symlink": lambda: path.symlink_to(victim), "fifo": lambda: os.mkfifo(path),
     "directory": path.mkdir}[kind]()
    with pytest.raises(atomic.UnsafePathError) as raised:
        atomic.open_file(path, mode)
    found = {"symlink": "a symbolic link", "fifo": "a named pipe (FIFO)",
             "directory": "a directory"}[kind]
    assert str(raised.value).startswith(f"{path} is {found}")
    assert victim.read_text() == "precious\n"  # never truncated or appended to


def test_a_users_link_is_followed_with_links_but_a_pipe_behind_it_is_not(tmp_path, bounded):
    target = tmp_path / "image.png"
    target.write_bytes(b"\x89PNG....")
    (tmp_path / "link.png").symlink_to(target)
    with atomic.open_file(tmp_path / "link.png", "rb", links=True) as f:
        assert f.read() == b"\x89PNG...."
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "pipe-link").symlink_to(tmp_path / "pipe")
    with pytest.raises(atomic.UnsafePathError, match="is a named pipe"):
        atomic.open_file(tmp_path / "pipe-link", "rb", links=True)


def test_regular_files_read_write_truncate_and_append_as_open_does(tmp_path):
    path = tmp_path / "f.txt"
    with atomic.open_file(path, "w") as f:
        f.write("abc\n")
    atomic.append_text(path, "déf\n")
    with atomic.open_file(path, newline="") as f:
        assert f.read() == "abc\ndéf\n"
    with atomic.open_file(path, "w") as f:  # truncates
        f.write("x")
    assert path.read_text() == "x"
    with pytest.raises(FileNotFoundError):
        atomic.open_file(tmp_path / "missing")


def _opens(path: Path) -> list[str]:
    """Calls in `path` that open a file another way: builtin open(), Path.open/read_text/
    read_bytes/write_text/write_bytes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} open()")
        elif isinstance(func, ast.Attribute) and func.attr in (
                "read_text", "read_bytes", "write_text", "write_bytes") or (
                isinstance(func, ast.Attribute) and func.attr == "open"
                and getattr(func.value, "id", "") not in ("os", "tarfile", "zipfile")):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{func.attr}()")
    return found


def test_every_open_of_runs_training_and_cli_goes_through_open_file():
    files = [p for folder in ("runs", "training", "cli") for p in (PACKAGE / folder).glob("*.py")]
    files.append(PACKAGE / "atomic.py")
    assert len(files) > 30
    assert [call for path in files for call in _opens(path)] == []
