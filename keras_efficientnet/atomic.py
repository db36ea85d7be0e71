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
    return _kind(mode)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    return "a socket" if stat.S_ISSOCK(mode) else "a device or other special file"


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
        with open_file(tmp, "rb+") as f:
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


# open()'s modes as os.open flags. Truncation waits until the file is known to be regular.
_MODES = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT, "a": os.O_WRONLY | os.O_CREAT
          | os.O_APPEND, "r+": os.O_RDWR, "w+": os.O_RDWR | os.O_CREAT,
          "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND}


def open_file(path: str | os.PathLike, mode: str = "r", *, links: bool = False,
              encoding: str | None = None, errors: str | None = None,
              newline: str | None = None, buffering: int = -1):
    """`open(path, mode)` for the package's files, checked the one way: the file object of a
    regular file, else UnsafePathError naming the path and what is there.

    Never through a symbolic link (O_NOFOLLOW; `links=True` follows them, for inputs a user
    names, which may be links); never blocked on a named pipe (O_NONBLOCK, cleared once fstat
    says the open file is regular: a FIFO would wait for a writer forever, and ignore
    SIGTERM meanwhile); never a directory, socket or device. "w" truncates only after that
    check. Every other OSError (missing, permission, ...) is raised as open() raises it.

    Example:
        >>> with open_file(run / "metrics.csv", "a", newline="") as f: ...
    """
    path = Path(path)
    binary = "b" in mode
    base = mode.replace("b", "").replace("t", "")
    flags = _MODES[base] | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as error:
        found = describe_path(path) if error.errno in (errno.ELOOP, errno.EISDIR,
                                                       errno.ENXIO) else None
        if found and (links is False or not found.startswith("a symbolic link")):
            raise UnsafePathError(_not_regular(path, found)) from None
        raise
    try:
        mode_bits = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode_bits):
            raise UnsafePathError(_not_regular(path, _kind(mode_bits)))
        os.set_blocking(fd, True)
        if base.startswith("w"):
            os.ftruncate(fd, 0)
        if binary:
            return os.fdopen(fd, mode, buffering)
        return os.fdopen(fd, mode.replace("t", ""), buffering, encoding=encoding or "utf-8",
                         errors=errors, newline=newline)
    except BaseException:
        os.close(fd)
        raise


def _not_regular(path: Path, found: str) -> str:
    return (f"{path} is {found}, not a regular file: files are never read or written through "
            "a link, a pipe or a folder; remove it (or give another path)")


def append_text(path: str | os.PathLike, text: str) -> None:
    """Appends `text` to the file `path` (created if missing) through `open_file`'s checks, in
    one write that is flushed; a write the system refuses (a full disk) is undone (the file cut
    back to its length before) and raised as WriteError naming the file, the free space and
    the fix."""
    path = Path(path)
    try:
        with open_file(path, "ab", buffering=0) as f:
            fd, data = f.fileno(), memoryview(text.encode("utf-8"))
            before = os.fstat(fd).st_size
            try:
                while data:  # os.write may write part of it
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, before)
                raise
    except OSError as error:
        if isinstance(error, (UnsafePathError, WriteError)):
            raise
        raise write_error(path, error) from None


def write_atomically(path: str | os.PathLike, text: str) -> Path:
    """Writes `text` to `path` atomically; returns the path."""
    with atomic_file(path) as tmp, open_file(tmp, "w") as f:
        f.write(text)
    return Path(path)
