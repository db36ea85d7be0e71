"""SIGTERM and SIGINT during a run: finish the step, checkpoint it, say where, exit non-zero.

Slurm and Kubernetes send SIGTERM before they kill a job (Slurm waits KillWait, 30 s by default;
Kubernetes terminationGracePeriodSeconds, 30 s); Ctrl-C sends SIGINT. While a training loop
runs, the first signal only sets `SignalWatch.requested`: the loop's checkpoint callback saves at
the end of the current step and raises `Preempted` naming the checkpoint. Outside a training loop
(loading data, building the model, evaluating) there is no step to save and the signal raises
`Preempted` at once. A second signal always raises at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """The run was stopped by a signal.

    Args:
        signum: the signal.
        checkpoint: the checkpoint written at the step where it stopped, or None.
        step: the global step of that checkpoint.
    """

    def __init__(self, signum: int, checkpoint=None, step: int | None = None):
        self.signum = signum
        self.checkpoint = checkpoint
        self.step = step
        super().__init__(self.describe())

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process the signal ended."""
        return 128 + int(self.signum)

    def describe(self) -> str:
        if self.checkpoint is not None:
            return (f"stopped by {self.signal_name} after step {self.step}: checkpoint written "
                    f"to {self.checkpoint}; run the same command to resume from that step")
        return (f"stopped by {self.signal_name} outside a training step: nothing new to save "
                "(earlier checkpoints are intact); run the same command to resume")


class SignalWatch:
    """Installs handlers for SIGTERM and SIGINT inside its context (main thread only).

    `deferred()` marks a training loop: there the first signal only sets `requested`, for the
    loop to checkpoint and raise `Preempted` at its next step boundary.

    Example:
        >>> with SignalWatch() as watch, watch.deferred():
        ...     model.fit(...)   # a callback checks watch.requested after each step
    """

    def __init__(self, signals=SIGNALS):
        self.signals = tuple(signals)
        self.requested: int | None = None
        self._deferring = 0
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.requested is not None or not self._deferring:
            self.requested = signum
            raise Preempted(signum)
        self.requested = signum

    def __enter__(self) -> SignalWatch:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    @contextlib.contextmanager
    def deferred(self) -> Iterator[SignalWatch]:
        self._deferring += 1
        try:
            yield self
        finally:
            self._deferring -= 1


@contextlib.contextmanager
def held(active: bool = True) -> Iterator[None]:
    """Blocks SIGTERM and SIGINT in this thread inside, so that the threads started inside
    (TensorFlow's, at its import) inherit the block and leave these signals to this thread.

    A C++ call that keeps the GIL and installs its own SIGTERM handler (TensorFlow's
    multi-worker start) can then be guarded by `distribute.watchdog`, which sees a signal
    pending process-wide only when no thread accepts it. A signal that arrives inside is
    delivered when the block ends. `active=False` makes this a no-op.
    """
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


_ACTIVE: SignalWatch | None = None


@contextlib.contextmanager
def watching() -> Iterator[SignalWatch]:
    """The process's SignalWatch: installed by the outermost caller (the command line, or
    `train_and_evaluate`), shared by the calls inside."""
    global _ACTIVE
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    with SignalWatch() as watch:
        _ACTIVE = watch
        try:
            yield watch
        finally:
            _ACTIVE = None
