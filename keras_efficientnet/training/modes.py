"""The table of `--mode`s, in plain Python: what each mode does, looked up by every module that
acts on it (the config check, the run directory, the driver, the summary) instead of testing the
mode's name. Like `plan.STRATEGY_TABLE`, it loads before TensorFlow, so `--mode` is checked
before anything in the run directory moves."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mode:
    """What one `--mode` does.

    Args:
      help: one line for `--help`.
      trains: trains from scratch (or resumes that training): needs `--epochs >= 1`, owns the
        run's `config.json` and `results.json`, and a fresh run (`--noresume`) moves an earlier
        run's files aside first. Modes that do not train start from an earlier run's weights
        and write `results-<mode>.json`, leaving that run's results alone.
      finetunes: fine-tunes the head at the test resolution after its start (its scores before
        the fine-tune are reported as `*_before_finetune`).
      scores_only: only scores an earlier run's weights (`--evaluate_weights`): it reads the run
        directory (no lock; it may run beside training), takes the run's own configuration
        from `config.json`, and writes no model, only its results file.
    """

    help: str
    trains: bool = False
    finetunes: bool = False
    scores_only: bool = False


MODE_TABLE: dict[str, Mode] = {
    "train": Mode("train, then evaluate", trains=True),
    "evaluate": Mode("score a finished run's weights (--evaluate_weights)", scores_only=True),
    "finetune": Mode("fine-tune the head of --init_checkpoint's weights at the test "
                     "resolution", finetunes=True),
    "train_and_finetune": Mode("train, then fine-tune the head at the test resolution",
                               trains=True, finetunes=True),
}
MODES = tuple(MODE_TABLE)


def modes_help() -> str:
    """`--mode`'s help text: each mode and what it does."""
    return "What to run: " + "; ".join(f"{name} = {mode.help}"
                                       for name, mode in MODE_TABLE.items()) + "."
