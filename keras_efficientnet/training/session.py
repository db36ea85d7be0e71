"""One run's hold on its process: the run directory and SIGTERM/SIGINT, from start to end.

Plain Python (no Keras or TensorFlow): the command line enters a `RunSession` before the
frameworks load, and `train_and_evaluate` enters its own only when it is called without one (a
notebook). Either way one object, entered once, owns both for the whole run.
"""

from __future__ import annotations

import contextlib

from keras_efficientnet.training import run_dir
from keras_efficientnet.training.preemption import SignalWatch


class RunSession:
    """Owns, while entered, the run directory (`run_dir.owned`: checked, locked, fresh-run rule)
    and the signal handling (`preemption.SignalWatch`: SIGTERM and SIGINT checkpoint the current
    step and raise `preemption.Preempted`).

    Args:
        config: the run's `TrainConfig` (model_dir, mode, resume).
        chief: whether this process owns the run directory; None when that is not known yet
            (a multi-process strategy learns it once its runtime has started): then
            `claim_run_dir(runtime.is_chief)` takes it.

    Example:
        >>> with RunSession(config, chief=True) as session:
        ...     results = train_and_evaluate(config, runtime, session=session)
    """

    def __init__(self, config, *, chief: bool | None = None):
        self.config = config
        self.chief = chief
        self.run_dir: run_dir.RunDir | None = None
        self.watch: SignalWatch | None = None
        self._claimed = False
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> RunSession:
        if self._stack is not None:
            raise RuntimeError("a RunSession is entered once, for the whole run")
        self._stack = contextlib.ExitStack()
        try:
            self.watch = self._stack.enter_context(SignalWatch())
            if self.chief is not None:
                self.claim_run_dir(self.chief)
        except BaseException:
            self._stack.close()
            raise
        return self

    def claim_run_dir(self, chief: bool) -> run_dir.RunDir | None:
        """Takes the run directory if this process is the `chief` (once: later calls return
        what the first did); returns what `run_dir.owned` did (None for other processes)."""
        if self._stack is None:
            raise RuntimeError("enter the RunSession before claiming its run directory")
        if not self._claimed:
            self.chief = chief
            self.run_dir = self._stack.enter_context(run_dir.owned(self.config, chief=chief))
            self._claimed = True
        return self.run_dir

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)
