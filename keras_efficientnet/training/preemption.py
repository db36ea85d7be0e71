"""SIGTERM and SIGINT during a run: finish the step, checkpoint it, say where, exit non-zero.

Slurm and Kubernetes send SIGTERM before they kill a job (Slurm waits KillWait, 30 s by default;
Kubernetes terminationGracePeriodSeconds, 30 s); Ctrl-C sends SIGINT. While a training loop
runs, the first signal only sets `SignalWatch.requested`: the loop's checkpoint callback saves at
the end of the current step and raises `Preempted` naming the checkpoint. Outside a training loop
(loading data, building the model, evaluating) there is no step to save and the signal raises
`Preempted` at once. A second signal always raises at once.

`Preempted` derives from `BaseException`, as `KeyboardInterrupt` does, because a signal lands
wherever the main thread is: inside a Keras layer call, whose `except Exception` rebuilds the
error as `type(error)(message)` (keras.src.utils.traceback_utils), or inside any library's
`except Exception: fallback`, which would swallow it. No `except Exception` sees it. A stop
that is noted but never raised (the handler ran in a destructor, whose exceptions Python only
prints; or after a training loop's last step boundary) is raised when its region ends.

Several processes (multi-worker, horovod) must stop at the same step, or the others wait in the
next all-reduce for the one that left: there the loop votes with its peers at every host call
(`SignalWatch.coordinated`, `agree`) and the checkpoint callback stops on the agreed signal.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(BaseException):
    """The run was stopped by a signal (a `BaseException`: the module docstring says why).

    Args:
        signum: the signal.
        checkpoint: the checkpoint written at the step where it stopped, or None.
        step: the global step of that checkpoint.
        by: the peers that received the signal, when this process did not (a multi-process run
            stops everywhere at the step the peers agreed on); None when this one received it.
        writer: who wrote `checkpoint` when not this process (e.g. "the chief").
        everywhere: the run has several processes, all stopped at `step`.
    """

    def __init__(self, signum: int, checkpoint=None, step: int | None = None, *,
                 by: str | None = None, writer: str | None = None, everywhere: bool = False):
        self.signum = signum
        self.checkpoint = checkpoint
        self.step = step
        self.by = by
        self.writer = writer
        self.everywhere = everywhere or by is not None or writer is not None
        super().__init__(self.describe())

    def __reduce__(self):  # copy and pickle rebuild it from its fields, not from its message
        return (_rebuild, (self.signum, self.checkpoint, self.step, self.by, self.writer,
                           self.everywhere))

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as a shell reports a process the signal ended."""
        return 128 + int(self.signum)

    def describe(self) -> str:
        source = self.signal_name if self.by is None else f"{self.signal_name} to {self.by}"
        if self.checkpoint is not None:
            written = (f"checkpoint written to {self.checkpoint}" if self.writer is None else
                       f"{self.writer} writes the checkpoint to {self.checkpoint}")
            where = " on every worker" if self.everywhere else ""
            return (f"stopped by {source} after step {self.step}: {written}; run the same "
                    f"command{where} to resume from that step")
        return (f"stopped by {self.signal_name} outside a training step: nothing new to save "
                "(earlier checkpoints are intact); run the same command to resume")


def _rebuild(signum, checkpoint, step, by, writer, everywhere) -> Preempted:
    return Preempted(signum, checkpoint, step, by=by, writer=writer, everywhere=everywhere)


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
        # (signal, the peers that received it) once the processes of a run agreed to stop.
        self.agreed: tuple[int, str] | None = None
        self._deferring = 0
        self._raised_at_once = False  # the handler raised (rather than noted) the stop
        self._coordinating = 0
        self._previous: dict = {}

    def stop_signal(self) -> int | None:
        """The signal to stop at this step boundary: this process's own, or inside
        `coordinated()` the one all processes agreed on (None: go on)."""
        if self._coordinating:
            return self.agreed[0] if self.agreed is not None else None
        return self.requested

    @property
    def coordinating(self) -> bool:
        """Inside `coordinated()`: the processes of a run stop together."""
        return self._coordinating > 0

    def stopped_by(self) -> str | None:
        """The peers that received the agreed signal when this process did not, else None."""
        if not self._coordinating or self.agreed is None or self.requested is not None:
            return None
        return self.agreed[1]

    def agree(self, signum: int, by: str) -> None:
        """Records the vote of all processes: stop on `signum`, which `by` received."""
        self.agreed = (int(signum), by)

    @contextlib.contextmanager
    def coordinated(self) -> Iterator[SignalWatch]:
        """A loop whose processes vote at each host call: the step boundary stops on `agreed`,
        not on this process's own signal, so that all stop at the same step. A signal this
        process received too late for the last vote raises at the end (no step left to save:
        the last epoch's checkpoint is written)."""
        self._coordinating += 1
        try:
            yield self
        finally:
            self._coordinating -= 1
        if self.requested is not None and self.agreed is None:
            raise Preempted(self.requested)

    def _handle(self, signum, frame):
        if self.requested is not None or not self._deferring:
            self.requested = signum
            self._raised_at_once = True
            raise Preempted(signum)
        self.requested = signum

    def __enter__(self) -> SignalWatch:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        self._raise_lost_stop(exc)

    def _raise_lost_stop(self, exc: BaseException | None) -> None:
        """Raises the stop a signal asked for when it did not reach here as `Preempted`: it was
        swallowed (a handler that ran in a destructor), turned into another error by a library
        that called back into Python, or noted after the last step boundary of a loop."""
        if self.requested is None or isinstance(exc, Preempted):
            return
        if exc is not None and not self._raised_at_once:
            return  # an error while the stop was only noted (a NaN loss): that error ends it
        raise Preempted(self.requested) from exc

    @contextlib.contextmanager
    def deferred(self) -> Iterator[SignalWatch]:
        self._deferring += 1
        try:
            yield self
        except BaseException as error:
            self._deferring -= 1
            self._raise_lost_stop(error)
            raise
        self._deferring -= 1
        if not self._deferring:  # a signal noted after the loop's last step boundary
            self._raise_lost_stop(None)


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

