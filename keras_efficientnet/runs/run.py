"""`open_run(path)`: a finished (or running) run directory read as a preset: its resolved
configuration, per-epoch history, best validation and results, and its models, each loaded on
first use. Plain Python until a model is asked for.

Example:
    >>> run = ke.open_run("runs/b0")
    >>> run.config.num_classes, run.best.val_top1, run.history[-1]["top1"]
    >>> model = run.models["best"]          # Keras loads here; also "final", "average", "latest"
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from keras_efficientnet.runs import record, weights


class _Models(Mapping):
    """The run's models by choice (`weights.CHOICES`), each built and loaded when first read."""

    def __init__(self, run: Run):
        self._run, self._loaded = run, {}

    def __getitem__(self, choice: str):
        if choice not in weights.CHOICES:
            raise KeyError(f"{choice!r}: a run's models are {', '.join(weights.CHOICES)}")
        if choice not in self._loaded:
            self._loaded[choice] = build_model(self._run.path, choice)
        return self._loaded[choice]

    def __iter__(self) -> Iterator[str]:
        return iter(weights.CHOICES)

    def __len__(self) -> int:
        return len(weights.CHOICES)


class Run:
    """A run directory's records and models.

    Args:
        path: the run directory (`--model_dir` of the run).

    Attributes:
        files: its `record.RunFiles`.
        config: its `record.RunConfig` (config.json), or None for a run that has none.
        history: one dict per epoch (metrics.csv: loss, top1, val_top1, ...; None where a cell
            is empty), else the results' history.
        best: its `record.BestRecord` (best.json), or None when nothing was validated.
        models: a mapping "final", "best", "average", "latest" -> the Keras model (lazy).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not weights.is_run_dir(self.path):
            raise ValueError(f"{self.path} is not a run directory (no {record.CHECKPOINTS}/, "
                             f"{record.CONFIG} or {record.MODEL}); give a --model_dir of a run")
        self.files = record.RunFiles(self.path)
        self.config = record.RunConfig.read(self.files.config)
        self.best = record.BestRecord.read(self.files.best_record)
        self.models = _Models(self)

    def results(self, mode: str | None = None) -> record.Results | None:
        """The results record of the run's training (`results.json`), or of a `mode` that
        scores or fine-tunes it afterwards (`results-<mode>.json`)."""
        return record.Results.read(self.files.results(mode))

    @property
    def history(self) -> list[dict]:
        path = self.files.metrics
        if path.is_file():
            try:
                return record.read_metrics(path)
            except (OSError, ValueError, UnicodeDecodeError) as error:
                raise ValueError(f"{path}: not a metrics table ({error})") from None
        results = self.results()
        return list(results.history or []) if results is not None else []

    def __repr__(self) -> str:
        model = self.config.config.get("model") if self.config else None
        return f"Run({str(self.path)!r}, model={model!r})"


def open_run(path: str | os.PathLike) -> Run:
    """The run in `path` (see `Run`); ValueError naming the path when it is not a run, and
    `record.RecordError` naming the file and field when a record cannot be read."""
    return Run(path)


def build_model(run: str | os.PathLike, choice: str = "final", **overrides):
    """`EfficientNet.from_preset("RUN:choice", **overrides)`: the run's architecture with the
    weights `choice` names (see `weights.run_preset`)."""
    from keras_efficientnet.models.efficientnet import EfficientNet

    return EfficientNet.from_preset(f"{run}:{choice}", **overrides)
