"""Atomic file writes: a temporary sibling, flushed to disk, renamed into place.

A reader (or a process restarted after a crash) sees the old file or the new one, never a part.
Standard library only, so every layer can use it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def fsync_directory(path: str | os.PathLike) -> None:
    """Flushes a directory's entries (a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path`; when the block completes, the file written there
    is flushed and renamed to `path`; when it raises, it is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_atomically(path: str | os.PathLike, text: str) -> Path:
    """Writes `text` to `path` atomically; returns the path."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)
    return Path(path)
