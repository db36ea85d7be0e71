"""TensorFlow's start-up lines, kept off the terminal unless asked for; log lines for people.

TensorFlow 2.21 writes its native start-up lines (the oneDNN notice, CPU features, "All log
messages before absl::InitializeLog()") from C++ during `import tensorflow`, and
TF_CPP_MIN_LOG_LEVEL no longer silences them all; the commands import TensorFlow with the
process's stderr file descriptor pointed at /dev/null instead. Python errors raised by the
import still print: the descriptor is restored before they propagate.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys


@contextlib.contextmanager
def native_stderr_silenced(enabled: bool = True):
    """Points file descriptor 2 at /dev/null for the block (C++ and Python writes alike)."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow(verbose: bool) -> None:
    """Imports TensorFlow (and Keras on it) now, with its start-up lines unless `verbose`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "2")
    with native_stderr_silenced(not verbose):
        import keras  # noqa: F401 - the import is the point
        import tensorflow  # noqa: F401


class PlainFormatter(logging.Formatter):
    """A log record as its message alone (`warning: ` or `error: ` before those), without
    absl's `I1206 05:04:20.730654 140446898922048 validation.py:119]` prefix."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            message = f"error: {message}"
        elif record.levelno >= logging.WARNING:
            message = f"warning: {message}"
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return message


def plain_log_lines() -> None:
    """absl's handler (which `app.run` puts on the root logger) writes PlainFormatter's lines;
    `--verbosity` keeps absl's full form (the command leaves this call out then)."""
    from absl import logging as absl_logging

    absl_logging.get_absl_handler().setFormatter(PlainFormatter())


def leave_without_collecting() -> None:
    """Called by a command that has finished its work, just before it exits: the interpreter's
    final garbage collection is skipped (`gc.freeze`).

    Measured on the smoke recipe (2 loaded cores): 6-10 s passed between the summary and the
    prompt, all of it in CPython's last collection (py-spy: `gc_collect_main` freeing
    TensorFlow's traced graphs, `PyOperation` by `PyOperation`). The operating system frees
    that memory at once. Frozen objects are still freed when their last reference goes (module
    teardown); only objects in reference cycles keep their memory, and none of those holds
    output: every file a command writes is closed (and renamed into place) before it returns,
    and the atexit handlers (absl's log flush among them) still run.
    """
    import gc

    gc.freeze()
