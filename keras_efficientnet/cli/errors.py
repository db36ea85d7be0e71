"""What the command line says when a run cannot go on: one line and an exit status, no traceback.

Exit status: 0 done; 1 the run failed on its way (a NaN or diverged loss, a disk that refused a
write); 2 bad input (flags, absl's own flag errors and unreadable flagfiles included, paths, data
sources, a model_dir in use, a path of the run that is a link or not a regular file); 128 + N
stopped by signal N (143 SIGTERM, 130 SIGINT) after checkpointing the current step: the same
command resumes from there. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

BAD_INPUT = 2
RUN_FAILED = 1
# Shown of a longer message (Keras puts whole tensors into some of its errors).
MAX_LINES = 3


def _one_line(error: BaseException) -> str:
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
        return f"error: {_one_line(error)}", RUN_FAILED
    if "UnavailableError" in names:  # TensorFlow's collectives after a peer stopped or died
        return (f"error: a peer of this multi-worker run stopped answering "
                f"({_one_line(error)}); start every worker again with the same command to "
                "resume from the last checkpoint"), RUN_FAILED
    if isinstance(error, (ValueError, ImportError, ConnectionError, FileNotFoundError,
                          NotADirectoryError, PermissionError)):
        return f"error: {_one_line(error)}", BAD_INPUT
    if isinstance(error, OSError):  # e.g. the disk filled while writing results
        return f"error: {_one_line(error)}", RUN_FAILED
    return None


def parse_flags_or_exit(argv: list[str]) -> list[str]:
    """absl's flag parsing (`app.run`'s `flags_parser`) with its errors as one line and exit
    status 2: an unknown flag, a value of the wrong type, a flagfile that cannot be read."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        line = _one_line(error).removeprefix("ERROR:: ")  # absl's prefix of flagfile errors
        print(f"error: {line} (--helpfull lists every flag)", file=sys.stderr, flush=True)
        sys.exit(BAD_INPUT)


def backend_problem(environ) -> str | None:
    """Why the trainer cannot run under `environ`'s KERAS_BACKEND (it needs TensorFlow's data
    pipeline, distribution and export), or None."""
    backend = environ.get("KERAS_BACKEND", "").strip()
    if backend in ("", "tensorflow"):
        return None
    return (f"the trainer needs TensorFlow but KERAS_BACKEND={backend!r}; run it with "
            "`unset KERAS_BACKEND` (or KERAS_BACKEND=tensorflow); the model, layers and "
            f"optimizers alone work under {backend}")
