"""Validation while training: every `--eval_every` epochs the held-out split is scored with the
weights the run would ship at that point (the weight average, else the optimizer's EMA, else
the latest weights), at the test resolution, bounded by `--eval_steps`.

After a fine-tune, the fine-tuned model's evaluation (the same split, resolution and steps)
competes too (`finetuned_competes`; best.json's `phase` says which phase won).

The best validated weights are kept as `<model_dir>/best.keras` (record: best.json), and the
epoch's checkpoint, once written, is copied to `checkpoints/best` (`saved`; never rotated away,
never resumed from; best.json names it and which of its files hold the scored weights).
`Validation` is called by the checkpointer at an epoch's end, after it updates the weight
average and before it records the epoch, so `val_top1`, `val_top5` and `val_loss` reach the
epoch line, the history in checkpoints and results.json, TensorBoard's `validation` run (Keras
writes `val_*` logs there) and metrics.csv.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import keras
import numpy as np

from keras_efficientnet.atomic import write_atomically

log = logging.getLogger("keras_efficientnet")

BEST_MODEL_FILE = "best.keras"  # beside model.keras: the best validated weights
BEST_RECORD_FILE = "best.json"  # which epoch that was, its scores and which weights


def read_best(model_dir) -> dict | None:
    """The best validation so far of the run in `model_dir` (best.json), or None."""
    path = Path(model_dir) / BEST_RECORD_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None  # rewritten at the next improvement


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
        self._pending = False  # a new best whose checkpoint is not written yet
        self._check_best_checkpoint()

    def _check_best_checkpoint(self) -> None:
        """On resume: warns when checkpoints/best does not match best.json (it is copied
        again at the next improvement)."""
        if self.best is None or not self.best.get("checkpoint"):
            return
        from keras_efficientnet.training.checkpoint import CheckpointManager

        manager = CheckpointManager(Path(self.best["checkpoint"]).parent)
        problem = manager.verify_best(self.best["epoch"])
        if problem:
            log.warning("the best checkpoint %s cannot be trusted: %s; best.keras stands, and "
                        "the next better validation replaces both", self.best["checkpoint"],
                        problem)

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
        best = -math.inf if self.best is None else self.best["val_top1"]
        if scores["top1"] > best:
            self._keep_best(epoch, scores, which)
        return {f"val_{name}": value for name, value in scores.items()}

    def _keep_best(self, epoch: int, scores: dict, which: str) -> None:
        """Writes best.keras (the copy with a softmax head, as model.keras) and best.json."""
        from keras_efficientnet.training.export import _save_keras_atomically, inference_model

        path = _save_keras_atomically(inference_model(self._copy),
                                      self.model_dir / BEST_MODEL_FILE)
        self.best = {"phase": "train", "epoch": epoch + 1, "val_top1": scores["top1"],
                     "val_top5": scores["top5"], "val_loss": scores["loss"], "weights": which,
                     "file": str(path)}
        self._pending = True
        write_atomically(self.model_dir / BEST_RECORD_FILE, json.dumps(self.best, indent=1))
        log.info("best validation top-1 so far (%.4f, epoch %d): wrote %s", scores["top1"],
                 epoch + 1, path)

    def saved(self, manager, checkpoint) -> None:
        """Called once the epoch's checkpoint is written: after a new best, copies it to
        checkpoints/best and names it in best.json with the file holding the scored weights."""
        if not self._pending or manager is None or checkpoint is None:
            return
        self._pending = False
        kept = manager.keep_best(checkpoint)
        files = {"the weight average": "average.npz (the weight average; model.weights.h5 "
                                       "holds the raw weights)",
                 "EMA": "optimizer.npz (the optimizer's EMA variables; model.weights.h5 holds "
                        "the raw weights)"}
        self.best.update(checkpoint=str(kept), checkpoint_of=Path(checkpoint).name,
                         scored_weights=files.get(self.best["weights"], "model.weights.h5"))
        write_atomically(self.model_dir / BEST_RECORD_FILE, json.dumps(self.best, indent=1))
        log.info("kept %s as %s", checkpoint, kept)


def finetuned_competes(config, model: keras.Model, scores: dict) -> dict | None:
    """The fine-tuned `model`, scored `scores` on the validation split as every validation, is
    written as best.keras (best.json: phase "finetune") when its top-1 beats the run's best.
    The fine-tune writes no checkpoints: checkpoints/best stays the training phase's best.
    Returns the record in best.json afterwards."""
    from keras_efficientnet.training.export import _save_keras_atomically, inference_model

    model_dir = Path(config.model_dir)
    best = read_best(model_dir)
    if best is not None and scores["top1"] <= best["val_top1"]:
        log.info("the fine-tuned model (top-1 %.4f) does not beat the best validation (%.4f, "
                 "%s phase): best.keras stays", scores["top1"], best["val_top1"],
                 best.get("phase", "train"))
        return best
    path = _save_keras_atomically(inference_model(model), model_dir / BEST_MODEL_FILE)
    record = {"phase": "finetune", "epoch": config.epochs,
              "finetune_epochs": config.finetune_epochs, "val_top1": scores["top1"],
              "val_top5": scores["top5"], "val_loss": scores["loss"],
              "weights": "the fine-tuned model", "file": str(path), "checkpoint": None,
              "scored_weights": "finetuned.weights.h5 (the fine-tune writes no checkpoints; "
                                "checkpoints/best holds the training phase's best)"}
    write_atomically(model_dir / BEST_RECORD_FILE, json.dumps(record, indent=1))
    log.info("the fine-tuned model is the best so far (top-1 %.4f): wrote %s", scores["top1"],
             path)
    return record
