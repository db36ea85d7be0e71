"""What a command says when it cannot go on: one line and an exit status, no traceback.

Every command (train, evaluate, predict, export, folder_to_tfrecord) exits with a status of
`EXIT_STATUSES`, this module's one table, and refuses bad input by raising `BadInput` (or a
ValueError) that its `main` prints as one `error:` line. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import signal
import textwrap

DONE = 0
RUN_FAILED = 1
BAD_INPUT = 2
SIGNAL_BASE = 128  # stopped by signal N: SIGNAL_BASE + N, as shells report it
# The one table of exit statuses; every command's --help prints it (`exit_status_help`).
EXIT_STATUSES = {
    DONE: "done",
    RUN_FAILED: "the run failed on its way (a NaN or diverged loss, a disk that refused a "
                "write, an output that cannot be written)",
    BAD_INPUT: "bad input: flags (absl's own flag errors and unreadable flagfiles included), "
               "paths, files that are not images or models, data sources, a model_dir in use, "
               "a path of the run that is a link or not a regular file",
    SIGNAL_BASE + signal.SIGINT: "stopped by SIGINT (train: after checkpointing the current "
                                 "step; the same command resumes from there)",
    SIGNAL_BASE + signal.SIGTERM: "stopped by SIGTERM (as SIGINT)",
}


class BadInput(ValueError):
    """A problem with a command's input: one `error:` line naming the flag, file or value and
    what would be valid, and exit status BAD_INPUT, before any expensive work."""


def exit_status_help() -> str:
    """The exit-status table as the commands' --help prints it: one status a line, wrapped."""
    rows = [textwrap.fill(text, 96, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
            for code, text in EXIT_STATUSES.items()]
    return "\n".join(["exit status:", *rows])


# Shown of a longer message (Keras puts whole tensors into some of its errors).
MAX_LINES = 3


def one_line(error: BaseException) -> str:
    """`error`'s message on one line (a long one cut to its first line and a count)."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()] or [
        type(error).__name__]
    if len(lines) > MAX_LINES:
        return f"{lines[0]} [{len(lines) - 1} more lines left out]"
    return " ".join(line.strip() for line in lines)


def describe(error: BaseException) -> tuple[str, int] | None:
    """(the line to print, the exit status) for an error a user can act on, else None."""
    from keras_efficientnet.training.preemption import Preempted

    if isinstance(error, Preempted):
        return error.describe(), error.exit_code
    # By name, so that describing never imports TensorFlow or Keras.
    names = {cls.__name__ for cls in type(error).__mro__}
    if names & {"NonFiniteLossError", "DivergenceError", "CheckpointWriteError"}:
        return f"error: {one_line(error)}", RUN_FAILED
    if "UnavailableError" in names:  # TensorFlow's collectives after a peer stopped or died
        return (f"error: a peer of this multi-worker run stopped answering "
                f"({one_line(error)}); start every worker again with the same command to "
                "resume from the last checkpoint"), RUN_FAILED
    if isinstance(error, (ValueError, ImportError, ConnectionError, FileNotFoundError,
                          NotADirectoryError, PermissionError)):
        return f"error: {one_line(error)}", BAD_INPUT
    if isinstance(error, OSError):  # e.g. the disk filled while writing results
        return f"error: {one_line(error)}", RUN_FAILED
    return None


def backend_problem(environ) -> str | None:
    """Why the trainer cannot run under `environ`'s KERAS_BACKEND (it needs TensorFlow's data
    pipeline, distribution and export), or None."""
    backend = environ.get("KERAS_BACKEND", "").strip()
    if backend in ("", "tensorflow"):
        return None
    return (f"the trainer needs TensorFlow but KERAS_BACKEND={backend!r}; run it with "
            "`unset KERAS_BACKEND` (or KERAS_BACKEND=tensorflow); the model, layers and "
            f"optimizers alone work under {backend}")
