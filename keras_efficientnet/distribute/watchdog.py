"""A bound on a call that blocks in C++ holding the GIL: a watchdog process ends this one.

TensorFlow's `MultiWorkerMirroredStrategy()` waits for its peers inside one C++ call that keeps
the GIL, and replaces the SIGTERM handler with its own (the preemption notifier, which only
logs): while it waits, no Python code of this process runs, so neither a thread, a timer nor a
Python signal handler can end it. `guarded(...)` starts a small process (this file, run as a
script, standard library only) that watches from outside: when the timeout passes, or when
SIGTERM or SIGINT is pending in this process, it writes the one line it was given to the
shared stderr and kills this process (SIGKILL: exit status 137, as the last resort must be;
Python could not act on anything gentler). The body runs with SIGTERM and SIGINT blocked in
the calling thread, so a signal stays pending (visible in /proc/PID/status) instead of reaching
TensorFlow's handler; every thread that must not take them has to be started with them blocked
(`preemption.held()` around the TensorFlow import does that). When the body returns, the
watchdog stops, the Python handlers are installed again (over TensorFlow's) and the signals are
unblocked, so a signal that arrived just then is handled as usual.

This process's own output is written by the watchdog only when the process cannot speak for
itself any more; otherwise the library logs and the command line prints, as everywhere.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL_S = 0.05  # how often the watchdog looks at the process; also the stop latency


def pending_signals(pid: int) -> set[int]:
    """Signals pending in process `pid` (process-wide or at its main thread), from /proc."""
    pending = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("ShdPnd:", "SigPnd:")):
                pending |= int(line.split()[1], 16)
    return {n for n in range(1, 65) if pending >> (n - 1) & 1}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(pid: int, timeout: float, on_timeout: str, on_signal: str, stop_fd: int) -> int:
    """The watchdog's loop: returns when `stop_fd` reaches end of file (the guarded call is
    done) or `pid` is gone; kills `pid` after `timeout` s or on a pending SIGTERM/SIGINT.
    `on_signal` may name the signal as {signal}."""
    for signum in SIGNALS:  # a job's SIGTERM to every process, Ctrl-C to the group: not ours
        signal.signal(signum, signal.SIG_IGN)
    deadline = time.monotonic() + timeout
    proc_readable = os.path.exists(f"/proc/{pid}/status")
    while True:
        ready, _, _ = select.select([stop_fd], [], [], POLL_S)
        if ready and not os.read(stop_fd, 1):
            return 0
        if not _alive(pid):
            return 0
        line = None
        if proc_readable:
            try:
                caught = [s for s in SIGNALS if s in pending_signals(pid)]
            except OSError:
                return 0  # the process ended between the two looks
            if caught:
                line = on_signal.format(signal=signal.Signals(caught[0]).name)
        if line is None and time.monotonic() > deadline:
            line = on_timeout
        if line is not None:
            os.write(2, (line + "\n").encode())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return 1


@contextlib.contextmanager
def guarded(timeout: float, *, on_timeout: str, on_signal: str) -> Iterator[None]:
    """Runs the body under a watchdog process (see the module docstring).

    Args:
        timeout: seconds the body may take before the watchdog ends the process.
        on_timeout: the line written then (e.g. "error: ... did not start within 60 s").
        on_signal: the line written when SIGTERM or SIGINT arrives meanwhile ({signal}: its
            name).

    Example:
        >>> with guarded(60, on_timeout="error: no peers", on_signal="stopped by {signal}"):
        ...     strategy = tf.distribute.MultiWorkerMirroredStrategy()
    """
    if timeout <= 0:
        raise ValueError(f"the watchdog's timeout must be > 0 seconds, received {timeout}")
    stop_read, stop_write = os.pipe()
    main_thread = threading.current_thread() is threading.main_thread()
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()),
             repr(float(timeout)), on_timeout, on_signal, str(stop_read)],
            pass_fds=(stop_read,), stdin=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        raise
    finally:
        os.close(stop_read)
    try:
        yield
    finally:
        os.close(stop_write)  # end of file: the watchdog returns
        child.wait()
        if main_thread:
            # The guarded call may have replaced the handlers at C level (TensorFlow's
            # SIGTERM notifier); Python still knows its own, so installing them again wins.
            for signum in SIGNALS:
                handler = signal.getsignal(signum)
                if handler is not None:
                    signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


if __name__ == "__main__":
    _pid, _timeout, _on_timeout, _on_signal, _fd = sys.argv[1:]
    sys.exit(watch(int(_pid), float(_timeout), _on_timeout, _on_signal, int(_fd)))
