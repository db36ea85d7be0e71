"""TensorFlow's start-up lines, kept off the terminal unless asked for.

TensorFlow 2.21 writes its native start-up lines (the oneDNN notice, CPU features, "All log
messages before absl::InitializeLog()") from C++ during `import tensorflow`, and
TF_CPP_MIN_LOG_LEVEL no longer silences them all; the commands import TensorFlow with the
process's stderr file descriptor pointed at /dev/null instead. Python errors raised by the
import still print: the descriptor is restored before they propagate.
"""

from __future__ import annotations

import contextlib
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
