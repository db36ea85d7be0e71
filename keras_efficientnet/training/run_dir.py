"""The run directory (`--model_dir`): checked before any work, owned by one run at a time, and
never shared between a fresh run and an earlier one.

Plain Python (no Keras or TensorFlow), so that the command line settles all of this in about a
second, before the frameworks load.

- `check_model_dir`: the path must be a directory (or creatable as one) that this process can
  write; a file, a path under a file or a read-only place fails with one line.
- `RunLock`: `<model_dir>/run.lock` names the owner (host, pid, start time, command) and is held
  with `flock` while the run lives. A second run fails at once naming the owner. A lock whose
  owner is gone (the kernel released its `flock`; without `flock`, a dead pid on this host) is
  taken over with a warning.
- `move_previous_run`: the fresh-run rule. A run that does not resume (`--noresume`) into a
  directory holding an earlier run's files moves them, untouched, to
  `<model_dir>/previous/<UTC time>/` first: nothing of the earlier run is deleted, and nothing of
  it is mixed into the new one (no checkpoint rotation across runs, no stale LATEST, no stale
  results.json).
- `owned(config)`: all of the above in order, as a context (`session.RunSession` enters it
  once per run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from keras_efficientnet import atomic
from keras_efficientnet.runs import record
from keras_efficientnet.runs.record import CHECKPOINTS, LOCK, PREVIOUS, RUN_ENTRIES
from keras_efficientnet.training.modes import MODE_TABLE

log = logging.getLogger("keras_efficientnet")

# LOCK, PREVIOUS, CHECKPOINTS and RUN_ENTRIES (what a fresh run moves aside) are the run
# record's: runs/record.py owns every file name of a run.


def results_name(mode: str) -> str:
    """`results.json` for a mode that trains; `results-<mode>.json` for evaluate and finetune,
    which work on an earlier run's weights and must not overwrite its results."""
    return record.results_name(mode, MODE_TABLE[mode].trains)


class RunDirError(ValueError):
    """The model_dir cannot be used: not a writable directory, or owned by another run."""


def check_model_dir(model_dir: str | os.PathLike) -> Path:
    """Creates `model_dir` if needed and proves it writable (a probe file); returns it.

    Raises RunDirError naming the path and the problem: it is a file, it lies under a file, or
    the process cannot write there (checked by writing, which also catches read-only mounts and
    cases `os.access` misjudges).
    """
    path = Path(model_dir)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--model_dir={str(path)!r} is a file, not a directory; give a "
                          "directory (it is created if missing)")
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise RunDirError(f"--model_dir={str(path)!r} lies under {str(ancestor)!r}, which is a "
                          "file; give a directory path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        reason = error.strerror or str(error)
        raise RunDirError(f"--model_dir={str(path)!r} is not writable ({reason}); give a "
                          "directory this user can write") from None
    return path


def _describe(holder: dict) -> str:
    if not holder:
        return "an unknown process"
    return (f"pid {holder.get('pid')} on {holder.get('host')}, started "
            f"{holder.get('started', '?')}: {holder.get('command', '?')}")


def _pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # someone else's live process, or a lock we cannot read: assume alive
    return True


class RunLock:
    """`<model_dir>/run.lock`: one run per directory.

    Args:
        model_dir: the run directory (must exist).

    Example:
        >>> lock = RunLock("runs/b0")
        >>> took_over = lock.acquire()    # RunDirError if another live run holds it
        >>> ...; lock.release()
    """

    def __init__(self, model_dir: str | os.PathLike):
        self.path = Path(model_dir) / LOCK
        self._fd: int | None = None

    def _open(self) -> int:
        """The lock file, never through a link and only if it is a regular file."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                         0o644)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise
            fd = None
        if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
            if fd is not None:
                os.close(fd)
            found = atomic.describe_path(self.path) or "not a regular file"
            raise RunDirError(f"{self.path} is {found}, not a regular file: the lock is never "
                              "taken through a link; remove it or give another --model_dir")
        return fd

    def _write(self, fd: int, record: dict) -> None:
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(record, allow_nan=False).encode())
            os.fsync(fd)
        except OSError as error:  # disk full, quota: name the file, the space, the fix
            raise atomic.write_error(self.path, error) from None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _read(self, fd: int) -> dict:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 1 << 16)
        try:
            holder = json.loads(data.decode("utf-8", "replace")) if data.strip() else {}
        except ValueError:
            holder = {"pid": "?", "host": "?", "command": f"unreadable lock {data[:80]!r}"}
        return holder if isinstance(holder, dict) else {}

    def _refuse(self, holder: dict, extra: str = "") -> RunDirError:
        return RunDirError(
            f"--model_dir={str(self.path.parent)!r} is in use by another run ({_describe(holder)})"
            f"; wait for it to end, stop it, or give another --model_dir{extra}")

    def acquire(self) -> dict | None:
        """Takes the lock; returns the previous owner's record when it took over a stale lock,
        else None. Raises RunDirError naming the owner when a live run holds it."""
        me = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": " ".join(redacted(getattr(sys, "orig_argv", sys.argv)))[:500]}
        for _ in range(10):
            fd = self._open()
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    flock_works = True
                except BlockingIOError:
                    raise self._refuse(self._read(fd)) from None
                except OSError as error:  # a filesystem without flock (ENOLCK, EOPNOTSUPP)
                    if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS,
                                           errno.EINVAL):
                        raise
                    flock_works = False
                try:
                    same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same_file = False
                if not same_file:  # its owner released (unlinked) it meanwhile: start again
                    os.close(fd)
                    continue
                holder = self._read(fd)
                if holder and not flock_works:
                    here = holder.get("host") == me["host"]
                    if not here:
                        raise self._refuse(holder, f" (this filesystem has no flock, so a lock "
                                                   f"from another host cannot be checked: if "
                                                   f"that run has ended, delete {self.path})")
                    if _pid_alive(holder.get("pid")) and holder.get("pid") != me["pid"]:
                        raise self._refuse(holder)
                self._write(fd, me)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return holder or None
        raise RunDirError(f"could not take {self.path}: other processes keep replacing it")

    def release(self) -> None:
        """Removes the lock file, then lets go of the lock (a waiter that opened the old file
        sees it is gone and starts again)."""
        if self._fd is None:
            return
        try:
            if os.fstat(self._fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


# Left inside every SavedModel that --export_dir writes: a later export may replace it whole.
EXPORT_MARK = "keras_efficientnet_export.json"


def check_export_dir(export_dir: str | os.PathLike) -> Path:
    """Raises UnsafePathError (a ValueError) unless `export_dir` is missing, an empty
    directory or an earlier export of ours (EXPORT_MARK inside), which an export replaces
    whole; a link, a file or a directory holding anything else is refused, naming it."""
    path = Path(export_dir)
    atomic.check_directory(path)
    if path.is_dir() and not (path / EXPORT_MARK).is_file():
        found = sorted(p.name for p in path.iterdir())
        if found:
            shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5
                                           else "")
            raise atomic.UnsafePathError(
                f"--export_dir={str(path)!r} is a non-empty directory that is not an export of "
                f"this project (it holds {shown}): nothing is merged into it; give a new or "
                "empty directory, or an earlier --export_dir")
    return path


# Flag names whose values run.lock leaves out (the command line may carry credentials).
SECRET_WORDS = ("token", "key", "secret", "password")


def _secret(name: str) -> bool:
    return any(word in name.lower() for word in SECRET_WORDS)


def redacted(argv: list[str]) -> list[str]:
    """`argv` with the values of flags named like credentials (SECRET_WORDS) replaced by
    `***`, in both `--name=value` and `--name value` forms."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append("***")
            hide_next = False
            continue
        hide_next = False
        name, eq, _ = arg.lstrip("-").partition("=")
        if arg.startswith("-") and _secret(name):
            if eq:
                arg = f"{arg.split('=', 1)[0]}=***"
            else:
                hide_next = True
        out.append(arg)
    return out


def move_previous_run(model_dir: str | os.PathLike) -> Path | None:
    """Moves an earlier run's files (RUN_ENTRIES) to `<model_dir>/previous/<UTC time>/`;
    returns that folder, or None when there was nothing to move. Other files stay put."""
    model_dir = Path(model_dir)
    entries = sorted({p for pattern in RUN_ENTRIES for p in model_dir.glob(pattern)})
    if not entries:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target, n = model_dir / PREVIOUS / stamp, 1
    while target.exists():
        n += 1
        target = model_dir / PREVIOUS / f"{stamp}-{n}"
    target.mkdir(parents=True)
    for entry in entries:
        os.replace(entry, target / entry.name)
    return target


def clean_interrupted_saves(model_dir: str | os.PathLike) -> int:
    """Removes what interrupted checkpoint saves left behind; returns how many entries."""
    from keras_efficientnet.training.checkpoint import CheckpointManager

    return CheckpointManager(Path(model_dir) / CHECKPOINTS).clean_interrupted()


@dataclasses.dataclass
class RunDir:
    """What `owned` did: the directory, the stale lock it took over (its owner's record), the
    folder an earlier run was moved to, and how many leftovers of interrupted saves it removed."""

    path: Path
    took_over: dict | None = None
    moved_to: Path | None = None
    cleaned: int = 0

    def notes(self) -> list[str]:
        """One line per thing a user should know, for the command line to print."""
        lines = []
        if self.took_over:
            lines.append(f"took over the lock of a run that ended without releasing it "
                         f"({_describe(self.took_over)})")
        if self.moved_to:
            lines.append(f"fresh run (--noresume): moved the earlier run's files to "
                         f"{self.moved_to}")
        if self.cleaned:
            lines.append(f"removed {self.cleaned} leftover(s) of interrupted checkpoint saves")
        return lines


def check_run_files(model_dir: Path, mode: str) -> None:
    """UnsafePathError (one line, exit status 2) when a file the run reads or writes
    (`record.RUN_FILES`, its results file) is a link, a named pipe, a folder or anything but a
    regular file: said when the run takes its directory, before the frameworks load, rather
    than at the first epoch's end (metrics.csv) or never (a pipe blocks the run for good)."""
    for name in dict.fromkeys((*record.RUN_FILES, results_name(mode))):
        atomic.check_regular(model_dir / name)


@contextlib.contextmanager
def owned(config, *, chief: bool = True) -> Iterator[RunDir | None]:
    """`_owned` under a umask that keeps everything the run writes from being group- or
    world-writable (the umask is the process's: TensorFlow's and h5py's files included)."""
    with atomic.restricted_umask(), _owned(config, chief=chief) as info:
        yield info


@contextlib.contextmanager
def _owned(config, *, chief: bool = True) -> Iterator[RunDir | None]:
    """Checks `config.model_dir`, takes its lock, cleans interrupted saves and applies the
    fresh-run rule, holds the lock inside the context; yields a RunDir (None when not chief).

    Entered once per run, by `session.RunSession` (the command line's before TensorFlow loads,
    or `train_and_evaluate`'s own when it is called without one). Evaluation only checks that the
    directory is writable: it reads checkpoints (written atomically) and writes its own
    results file, so it may run beside a training run. Other workers than the chief write
    nothing and skip all of this.
    """
    if not chief:
        yield None
        return
    path = check_model_dir(config.model_dir)
    if getattr(config, "export_dir", ""):
        check_export_dir(config.export_dir)
    for entry in (CHECKPOINTS, record.LOGS):  # written into: never through a link
        atomic.check_directory(path / entry)
    if MODE_TABLE[config.mode].scores_only:  # reads the run directory only: no lock
        check_run_files(path, config.mode)
        yield RunDir(path)
        return
    lock = RunLock(path)
    info = RunDir(path, took_over=lock.acquire())
    try:
        if info.took_over:
            log.warning(info.notes()[0])
        info.cleaned = clean_interrupted_saves(path)
        if MODE_TABLE[config.mode].trains and not config.resume:
            info.moved_to = move_previous_run(path)
        for line in info.notes()[1:] if info.took_over else info.notes():
            log.info(line)
        check_run_files(path, config.mode)  # after the fresh-run rule moved an earlier run's
        yield info
    finally:
        lock.release()
