"""Validation while training: every `--eval_every` epochs the held-out split is scored with the
weights the run would ship at that point (the weight average, else the optimizer's EMA, else
the latest weights), at the test resolution, bounded by `--eval_steps`.

After a fine-tune, the fine-tuned model's evaluation (the same split, resolution and steps)
competes too (`finetuned_competes`; best.json's `phase` says which phase won).

The best validated weights are kept as `<model_dir>/best.keras` (record: best.json, a
`record.BestRecord`), and the epoch's checkpoint, once written, is copied to `checkpoints/best`
(never rotated away, never resumed from; best.json names it and which of its files hold the
scored weights). Both files and the record are written only once the epoch's checkpoint is
(`saved`), in that order: the copy, best.keras, then best.json last, so best.json never names an
epoch whose copy is not complete. Paths in best.json are relative to the run. An unreadable
best.json stops the run with one line (it is never taken for "no best yet").

A validation whose loss or scores are not finite (the shipped weights give NaN or infinite
outputs, e.g. normalization statistics that are) is never a best: it is warned about in one
line and recorded as it is (metrics.csv writes `nan`; results.json null, named in its
`non_finite` field); `NON_FINITE_STOP` such validations in a row stop the run
(`NonFiniteValidationError`, exit status 1) as a diverged loss does.
`Validating` (a callback) calls `Validation` at an epoch's end, after `Averaging` updates the
weight average and before `EpochHistory` and the `Checkpointer` record the epoch, so `val_top1`,
`val_top5` and `val_loss` reach the epoch line, the history in checkpoints and results.json,
TensorBoard's `validation` run (Keras writes `val_*` logs there) and metrics.csv.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

import keras
import numpy as np

from keras_efficientnet.runs.record import BEST_MODEL as BEST_MODEL_FILE
from keras_efficientnet.runs.record import (
    WEIGHTS,
    BestRecord,
    RecordError,
    RunFiles,
    non_finite,
)
from keras_efficientnet.training.callbacks import NonFiniteValidationError

log = logging.getLogger("keras_efficientnet")

# Non-finite validations in a row that stop the run. One is tolerated (warned about), as the
# divergence guard tolerates a spike; the second means the shipped weights stay broken (a
# weight average or EMA holding a NaN keeps it for good), so more epochs only cost time.
NON_FINITE_STOP = 2

# Which files of checkpoints/best hold the weights a validation scored.
SCORED_FILES = {
    "the weight average": "average.npz (the weight average; model.weights.h5 holds the raw "
                          "weights)",
    "EMA": "optimizer.npz (the optimizer's EMA variables; model.weights.h5 holds the raw "
           "weights)"}


def read_best(model_dir) -> dict | None:
    """The best validation so far of the run in `model_dir` (best.json), or None when there is
    none. An unreadable record raises `record.RecordError` (one line naming the file): taken
    for "no best yet", a worse model would replace best.keras."""
    path = RunFiles(model_dir).best_record
    try:
        best = BestRecord.read(path)
    except RecordError as error:
        raise RecordError(f"{error} (best.json records the run's best validation; remove it "
                          "and best.keras to start the record afresh)") from None
    if best is None:
        return None
    record = best.to_dict()
    del record["version"]
    return record


def shipping_weights(model: keras.Model, average) -> tuple[list, str]:
    """The weights the run would ship now, and which they are."""
    if average is not None and average.values is not None:
        return average.weights_like(model), "the weight average"
    optimizer = getattr(model, "optimizer", None)
    moving = getattr(optimizer, "_model_variables_moving_average", None)
    if getattr(optimizer, "use_ema", False) and moving:
        ema = {v.path: m for v, m in zip(optimizer._trainable_variables, moving)}
        return [keras.ops.convert_to_numpy(ema.get(v.path, v)) for v in model.weights], "EMA"
    return model.get_weights(), "the latest weights"


class Validation:
    """Scores the held-out split every `every` epochs (a one-device copy of the model at the
    test resolution, built once); returns the `val_*` logs of the epoch, empty when not due."""

    def __init__(self, config, num_classes: int, steps: int, skip_counter=None):
        self.config, self.num_classes, self.steps = config, num_classes, steps
        self.every = config.eval_every
        self.skip_counter = skip_counter
        self._copy = self._data = None
        self._said = False
        # The chief keeps the best validated model (a resumed run continues the record).
        self.model_dir = Path(config.model_dir)
        self.best = read_best(self.model_dir)
        self._pending = None  # a new best's model, until the epoch's checkpoint is written
        self.non_finite: list[int] = []  # the epochs of the non-finite validations in a row
        self._check_best_checkpoint()

    def _check_best_checkpoint(self) -> None:
        """On resume: warns when checkpoints/best does not match best.json (it is copied
        again at the next improvement)."""
        if self.best is None or not self.best.get("checkpoint"):
            return
        from keras_efficientnet.training.checkpoint import CheckpointManager

        files = RunFiles(self.model_dir)
        manager = CheckpointManager(files.checkpoints)
        problem = manager.verify_best(self.best["epoch"])
        if problem:
            log.warning("the best checkpoint %s does not match %s (epoch %d): %s; trusting "
                        "best.json and best.keras, and the next better validation replaces "
                        "all three", files.best_checkpoint, files.best_record,
                        self.best["epoch"], problem)

    def due(self, epoch: int) -> bool:
        return self.every > 0 and (epoch + 1) % self.every == 0

    def _build(self):
        from keras_efficientnet.training.builders import (
            build_datasets,
            build_model,
            compile_model,
            evaluation_steps,
            resolutions,
            split_info,
        )

        config, resolution = self.config, resolutions(self.config)[1]
        if self.steps is None:  # not given: the held-out split alone is counted
            self.steps = evaluation_steps(config, split_info(config, config.eval_split)
                                          .num_examples)
        self._copy = build_model(config, resolution, self.num_classes)
        compile_model(self._copy, "sgd", config, self.num_classes)
        self._data = build_datasets(config, resolution, training=False,
                                    split=config.eval_split, repeat=False,
                                    num_classes=self.num_classes,
                                    skip_counter=self.skip_counter)

    def __call__(self, epoch: int, model: keras.Model, average) -> dict:
        if not self.due(epoch):
            return {}
        from keras_efficientnet.training.builders import evaluate, reporting_data_errors

        if self._copy is None:
            self._build()
        weights, which = shipping_weights(model, average)
        if not self._said:
            log.info("validation every %d epoch(s) on %s with %s", self.every,
                     self.config.eval_split, which)
            self._said = True
        self._copy.set_weights([np.asarray(w) for w in weights])
        with reporting_data_errors(self.skip_counter):
            scores = evaluate(self._copy, self._data, self.steps)
        bad = non_finite(scores)
        if bad:
            self._not_finite(epoch, scores, bad, which)
        else:
            self.non_finite = []
            best = -math.inf if self.best is None else self.best["val_top1"]
            if scores["top1"] > best:
                self._keep_best(epoch, scores, which)
        return {f"val_{name}": value for name, value in scores.items()}

    def _not_finite(self, epoch: int, scores: dict, bad: list[str], which: str) -> None:
        """A non-finite validation: never a best; one warning line, and the run stops at the
        NON_FINITE_STOP-th in a row."""
        self.non_finite.append(epoch + 1)
        found = ", ".join(f"val_{name} {scores[name]}" for name in bad)
        kept = (f"best.keras stays epoch {self.best['epoch']}'s" if self.best is not None
                else "no best.keras is written")
        why = (f"{which} give non-finite outputs on the {self.config.eval_split} split "
               "(normalization statistics or weights that are NaN or infinite)")
        if len(self.non_finite) >= NON_FINITE_STOP:
            epochs = ", ".join(str(e) for e in self.non_finite)
            raise NonFiniteValidationError(
                f"validation was not finite {len(self.non_finite)} times in a row (epochs "
                f"{epochs}; {found}): {why}; {kept}, and this epoch's checkpoint is not "
                "written. Check the normalization statistics of --weights or "
                "--init_checkpoint, or lower --learning_rate")
        log.warning("validation after epoch %d is not finite (%s): %s; not a best (%s); "
                    "%d such validations in a row stop the run", epoch + 1, found, why, kept,
                    NON_FINITE_STOP)

    def _keep_best(self, epoch: int, scores: dict, which: str) -> None:
        """Holds the new best (the copy with a softmax head, as model.keras, and its record)
        until the epoch's checkpoint is written (`saved`)."""
        from keras_efficientnet.training.export import inference_model

        self.best = BestRecord(phase="train", epoch=epoch + 1, val_top1=scores["top1"],
                               val_top5=scores["top5"], val_loss=scores["loss"], weights=which,
                               file=BEST_MODEL_FILE).to_dict()
        del self.best["version"]
        self._pending = inference_model(self._copy)
        log.info("best validation top-1 so far (%.4f, epoch %d)", scores["top1"], epoch + 1)

    def saved(self, manager, checkpoint) -> None:
        """Called once the epoch's checkpoint is written (None when this process writes
        none): after a new best, copies it to checkpoints/best, writes best.keras, and then
        best.json naming both and the file holding the scored weights."""
        if self._pending is None:
            return
        from keras_efficientnet.training.export import _save_keras_atomically

        files = RunFiles(self.model_dir)
        best = BestRecord(**self.best)
        if manager is not None and checkpoint is not None:
            kept = manager.keep_best(checkpoint)
            best = dataclasses.replace(
                best, checkpoint=files.relative(kept), checkpoint_of=Path(checkpoint).name,
                scored_weights=SCORED_FILES.get(best.weights, WEIGHTS))
            log.info("kept %s as %s", checkpoint, kept)
        path = _save_keras_atomically(self._pending, files.best_model)
        self._pending = None
        best.write(files.best_record)  # last: it names the copy and the model above
        self.best = {k: v for k, v in best.to_dict().items() if k != "version"}
        log.info("wrote %s and %s", path, files.best_record)


class Validating(keras.callbacks.Callback):
    """Adds a `Validation`'s `val_*` logs to each epoch's logs where it is due; placed before
    the history and the checkpointer, which record them (its `saved` goes to the
    checkpointer's `after_save`, which copies a new best's checkpoint).

    Args:
        validation: the `Validation`.
        average: the run's `WeightAverage` (the weights it scores), or None.
    """

    def __init__(self, validation: Validation, average=None):
        super().__init__()
        self.validation = validation
        self.average = average

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.validation(epoch, self.model, self.average))


def finetuned_competes(config, model: keras.Model, scores: dict) -> dict | None:
    """The fine-tuned `model`, scored `scores` on the validation split as every validation, is
    written as best.keras (best.json: phase "finetune") when its top-1 beats the run's best.
    The fine-tune writes no checkpoints: checkpoints/best stays the training phase's best.
    Returns the record in best.json afterwards."""
    from keras_efficientnet.training.export import _save_keras_atomically, inference_model

    files = RunFiles(config.model_dir)
    best = read_best(files.root)
    if non_finite(scores):  # never a best; the trainer refuses to ship it (NonFiniteModelError)
        return best
    if best is not None and scores["top1"] <= best["val_top1"]:
        log.info("the fine-tuned model (top-1 %.4f) does not beat the best validation (%.4f, "
                 "%s phase): best.keras stays", scores["top1"], best["val_top1"],
                 best.get("phase", "train"))
        return best
    path = _save_keras_atomically(inference_model(model), files.best_model)
    record = BestRecord(
        phase="finetune", epoch=config.epochs, finetune_epochs=config.finetune_epochs,
        val_top1=scores["top1"], val_top5=scores["top5"], val_loss=scores["loss"],
        weights="the fine-tuned model", file=BEST_MODEL_FILE, checkpoint=None,
        scored_weights=f"{files.finetuned_weights.name} (the fine-tune writes no checkpoints; "
                       f"{files.relative(files.best_checkpoint)} holds the training phase's "
                       "best)")
    record.write(files.best_record)
    log.info("the fine-tuned model is the best so far (top-1 %.4f): wrote %s", scores["top1"],
             path)
    return {k: v for k, v in record.to_dict().items() if k != "version"}
