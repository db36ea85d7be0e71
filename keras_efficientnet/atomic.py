"""Atomic file writes: a temporary sibling, flushed to disk, renamed into place.

A reader (or a process restarted after a crash) sees the old file or the new one, never a part.
Nothing is written through a link: a path that is a symbolic link, a directory or anything but a
regular file is refused (`UnsafePathError`). A write the system refuses (disk full, quota,
permissions, read-only) raises `WriteError`, naming the file, the free space and the fix, and
leaves nothing half-written. Standard library only, so every layer can use it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
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


# Permission bits no file or folder of a run gets, whatever the umask: group and world write.
NOT_WRITABLE_BY_OTHERS = 0o022
FILE_MODE = 0o644


class UnsafePathError(ValueError):
    """A path the run would write is a symbolic link or not a regular file (bad input)."""


class WriteError(OSError):
    """The system refused a write; the message names the file, the free space and the fix."""

    def __init__(self, errno_: int | None, message: str):
        super().__init__(errno_, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def describe_path(path: Path) -> str | None:
    """What is at `path` when it is not a regular file (or nothing), else None."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(path)!r})"
    if stat.S_ISREG(mode):
        return None
    return "a directory" if stat.S_ISDIR(mode) else "not a regular file"


def check_regular(path: str | os.PathLike) -> Path:
    """Raises UnsafePathError when `path` exists and is not a regular file; returns it."""
    path = Path(path)
    found = describe_path(path)
    if found:
        raise UnsafePathError(f"{path} is {found}, not a regular file: the run writes only "
                              "its own regular files and never through a link; remove it or "
                              "give another --model_dir")
    return path


def check_directory(path: str | os.PathLike) -> Path:
    """Raises UnsafePathError when `path` exists and is a symbolic link or not a directory."""
    path = Path(path)
    if os.path.islink(path) or (path.exists() and not path.is_dir()):
        what = f"a symbolic link (to {os.readlink(path)!r})" if os.path.islink(path) else (
            "not a directory")
        raise UnsafePathError(f"{path} is {what}: the run writes only into its own "
                              "directories and never through a link; remove it or give another "
                              "--model_dir")
    return path


def _reason(error: OSError) -> str:
    # h5py puts the OS error inside a long report: "... error message = 'No space left ...'".
    found = re.search(r"error message = '([^']*)'", str(error))
    if found:
        return found[1]
    if error.strerror:
        return error.strerror
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else type(error).__name__


def human_bytes(count: float) -> str:
    """`count` bytes as `123 bytes`, `4.5 MiB`, `1.2 GiB`."""
    unit = "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if count < 1024:
            break
        count, unit = count / 1024, bigger
    return f"{count:.0f} bytes" if unit == "bytes" else f"{count:.1f} {unit}"


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space(path: str | os.PathLike) -> str:
    """The free space of the filesystem holding `path` (or its nearest existing parent)."""
    try:
        return f"{human_bytes(shutil.disk_usage(_existing(Path(path))).free)} free"
    except OSError:
        return "free space unknown"


# Room a write needs beyond its arrays (file formats' headers, metadata, small files).
SPACE_MARGIN = 1 << 20


def require_space(path: str | os.PathLike, nbytes: int) -> None:
    """Raises OSError(ENOSPC) before a write of about `nbytes` into `path`'s filesystem when it
    does not have them (plus SPACE_MARGIN): a write that fills the disk part-way can leave
    libraries (HDF5) holding a file they cannot flush."""
    try:
        free = shutil.disk_usage(_existing(Path(path))).free
    except OSError:
        return
    if free < nbytes + SPACE_MARGIN:
        raise OSError(errno.ENOSPC, f"No space left on device (the write needs about "
                                    f"{human_bytes(nbytes + SPACE_MARGIN)})")


def fix_for(error: OSError, path: Path) -> str:
    """What to do about a refused write."""
    text = str(error).lower()
    if error.errno in (errno.EACCES, errno.EPERM) or "permission denied" in text:
        return (f"give this user write permission on {path.parent} (or another --model_dir), "
                "then rerun the same command")
    if error.errno == errno.EROFS or "read-only" in text:
        return "give a --model_dir on a writable filesystem, then rerun the same command"
    return ("free space (or raise the quota, or give a --model_dir on another disk), then rerun "
            "the same command")


def write_error(path: Path, error: OSError, what: str = "") -> WriteError:
    """A WriteError naming `path` (described as `what`), the reason, free space and the fix."""
    if isinstance(error, WriteError):
        return error
    return WriteError(error.errno, f"could not write {what or path}: {_reason(error)} "
                                   f"({free_space(path.parent)} there); nothing half-written "
                                   f"was left. Fix: {fix_for(error, path)}")


def private_mode(path: str | os.PathLike, mode: int = FILE_MODE) -> None:
    """Sets `path`'s mode to `mode` without group or world write."""
    os.chmod(path, mode & ~NOT_WRITABLE_BY_OTHERS)


@contextlib.contextmanager
def restricted_umask() -> Iterator[None]:
    """Adds group and world write to the process's umask inside the block (what the process
    creates meanwhile, other libraries' files included, is writable by its owner only)."""
    previous = os.umask(NOT_WRITABLE_BY_OTHERS)
    os.umask(previous | NOT_WRITABLE_BY_OTHERS)
    try:
        yield
    finally:
        os.umask(previous)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path`; when the block completes, the file written there
    is flushed and renamed to `path`; when it raises, it is removed and `path` is untouched.

    Raises UnsafePathError when `path` is a link or not a regular file (before any write) and
    WriteError when the system refuses the write."""
    path = check_regular(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        os.close(fd)
        tmp = Path(name)
        yield tmp
        check_regular(tmp)  # the block may have replaced it: never flush through a link
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        private_mode(tmp)
        check_regular(path)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    except BaseException as error:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, (UnsafePathError, WriteError)):
            raise write_error(path, error) from None
        raise


def write_atomically(path: str | os.PathLike, text: str) -> Path:
    """Writes `text` to `path` atomically; returns the path."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)
    return Path(path)
