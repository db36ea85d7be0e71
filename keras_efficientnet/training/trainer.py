"""The trainer's driver: `train_and_evaluate` runs a config's mode, `train` the training phase.

Read top to bottom: `train_and_evaluate` takes the run (`session.RunSession`), then `_run_mode`
trains or loads the model, evaluates it, fine-tunes it, saves it and writes the results. The
builders live in `builders`, the resume rules in `resume`, the fine-tune in `finetune`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import keras

from keras_efficientnet.runs.environment import environment
from keras_efficientnet.runs.record import RunFiles, non_finite
from keras_efficientnet.training.builders import (
    build_datasets,
    build_model,
    build_optimizer,
    class_names,
    compile_model,
    dataset_facts,
    evaluate,
    evaluation_steps,
    flip_averaged,
    images_scored,
    input_options,
    lr_schedule,
    precision_policy,
    reporting_data_errors,
    resolutions,
    save_outputs,
    use_one_hot,
)
from keras_efficientnet.training.callbacks import (
    Averaging,
    Checkpointer,
    Contents,
    DivergenceGuard,
    EpochHistory,
    NonFiniteLossGuard,
    NonFiniteModelError,
    Position,
    RestoredMetrics,
    SaveEvery,
    Throughput,
)
from keras_efficientnet.training.checkpoint import CheckpointManager
from keras_efficientnet.training.config import TrainConfig
from keras_efficientnet.training.evaluation import load_evaluated_weights
from keras_efficientnet.training.export import save_weights_atomically
from keras_efficientnet.training.finetune import (
    HEAD_LAYERS,
    finetune,
    finetune_config,
    finetune_schedule,
)
from keras_efficientnet.training.modes import MODE_TABLE
from keras_efficientnet.training.optimizer_state import SlotAverage, read_slots
from keras_efficientnet.training.preemption import SignalWatch
from keras_efficientnet.training.reporting import MetricsCSV
from keras_efficientnet.training.results import results_path, write_results
from keras_efficientnet.training.resume import (
    build_metrics,
    fit_does_not_finalize,
    load_weights_for,
    resume_point,
)
from keras_efficientnet.training.run_config import write_run_config
from keras_efficientnet.training.runtime import OneDevice
from keras_efficientnet.training.session import RunSession
from keras_efficientnet.training.validation import Validating, Validation, finetuned_competes
from keras_efficientnet.training.warm_start import warm_start

log = logging.getLogger("keras_efficientnet")


def train_and_evaluate(config: TrainConfig, runtime=None,
                       session: RunSession | None = None) -> dict:
    """Runs `config.mode` and writes its results file in model_dir; returns the results.

    `results.json` for train and train_and_finetune; `results-evaluate.json` and
    `results-finetune.json` for the modes that reuse an earlier run's weights.

    `runtime` places training and fine-tuning (default: one device; see
    `keras_efficientnet.distribute.run`, which builds it from the config). Evaluation runs on
    one device in every process; only the chief process writes results and weights.

    `session` (a `RunSession`, entered) owns model_dir and the signals for the whole run; the
    command line enters it before the frameworks load. Without one, this call enters its own:
    it owns model_dir while it runs (checked, locked, fresh-run rule) and turns SIGTERM and
    SIGINT into a checkpoint at the current step (`preemption.Preempted`).
    """
    started = time.perf_counter()
    runtime = runtime if runtime is not None else OneDevice(config.plan)
    if session is None:
        with RunSession(config, chief=runtime.is_chief) as own:
            return _run_mode(config, runtime, own, started)
    session.claim_run_dir(runtime.is_chief)
    return _run_mode(config, runtime, session, started)


def _run_mode(config: TrainConfig, runtime, session: RunSession, started: float) -> dict:
    from keras_efficientnet.datasets import SkipCounter

    run = _Run(config, runtime, session, SkipCounter())
    if runtime.is_chief and MODE_TABLE[config.mode].trains:
        write_run_config(config, num_classes=run.num_classes, class_names=class_names(config),
                         train_resolution=resolutions(config)[0],
                         test_resolution=run.test_res)
    with precision_policy(config.precision):
        model, weights_from = run.trained_or_loaded_model()
        final_model = run.evaluate_and_finetune(model, weights_from)
        # A model whose outputs are not finite on the held-out split is never shipped.
        unfit = non_finite({k: run.results.get(k) for k in FINAL_SCORES})
        if runtime.is_chief and not unfit:
            run.results.update(save_outputs(config, final_model))
    run.results["skipped_images"] = run.skipped.count
    run.results["environment"] = environment()
    run.results["wall_seconds"] = time.perf_counter() - started
    if runtime.is_chief:
        write_results(config, run.results)
    if unfit:
        raise _unfit_model(config, run.results, unfit)
    return run.results


# The scores of the model a mode saves (after its fine-tune where it fine-tunes).
FINAL_SCORES = ("top1", "top5", "loss", "flip_top1", "flip_top5", "flip_loss")


def _unfit_model(config: TrainConfig, results: dict, unfit: list[str]) -> NonFiniteModelError:
    files = RunFiles(config.model_dir)
    written = results_path(config).name
    refused = ("no model file is written" if MODE_TABLE[config.mode].scores_only else
               f"{files.model} was not written")
    if config.export_dir:
        refused += f", nor --export_dir={config.export_dir}"
    found = ", ".join(f"{name} {results[name]}" for name in unfit)
    return NonFiniteModelError(
        f"the model's outputs on the {config.eval_split} split are not finite ({found}, "
        f"weights: {results.get('weights') or 'the trained weights'}): {refused}; {written} "
        "records these scores as null and names them in its non_finite field. Check the "
        "normalization statistics of --weights or --init_checkpoint, or lower --learning_rate")


class _Run:
    """One call of `train_and_evaluate`: the config, runtime, session, the source's facts and
    the results as they fill in, with one method per phase."""

    def __init__(self, config: TrainConfig, runtime, session: RunSession, skipped):
        self.config, self.runtime, self.session, self.skipped = config, runtime, session, skipped
        # The fine-tune's optimizer state: the slots averaged with the weights (else the last).
        self.slots: list = []
        self._scorer = self._mirrored = None  # built by the first evaluation (`scorer`)
        self.train_examples, eval_examples, self.num_classes = dataset_facts(config)
        self.test_res = resolutions(config)[1]
        self.eval_steps = evaluation_steps(config, eval_examples)
        self.results = {
            "mode": config.mode, "model": config.model, "dataset": config.dataset,
            "global_batch_size": config.global_batch_size, "num_classes": self.num_classes,
            "train_examples": self.train_examples, "eval_examples": eval_examples,
            "eval_images_scored": images_scored(config, eval_examples),
            "config": config.to_dict()}

    def trained_or_loaded_model(self) -> tuple[keras.Model, str]:
        """Train modes train (and take the weight average); evaluate and finetune load."""
        config = self.config
        mode = MODE_TABLE[config.mode]
        if not mode.trains:
            keras.utils.set_random_seed(config.seed)
            model = build_model(config, self.test_res, self.num_classes)
            if mode.scores_only:
                return model, load_evaluated_weights(config, model)
            return model, load_weights_for(config, model, slots=self.slots)
        trained = train(config, self.num_classes, self.train_examples, runtime=self.runtime,
                        skip_counter=self.skipped, watch=self.session.watch,
                        eval_steps=self.eval_steps)
        model, checkpoint = trained["model"], trained["checkpoint"]
        self.slots = ((trained["average"] and trained["average"].slots(model))
                      or read_slots(model.optimizer))
        self.results.update(epochs=config.epochs, train_resolution=trained["resolution"],
                            images_per_second=trained["images_per_second"],
                            history=trained["history"], best=trained["best"],
                            checkpoint=str(checkpoint) if checkpoint else None)
        average = trained["average"]
        if average is None or average.values is None:
            return model, ""
        model.set_weights(average.weights_like(model))
        return model, "weight average"

    def scorer(self) -> keras.Model:
        """The one compiled model at the test resolution that scores this run's evaluations
        (before and after the fine-tune), given each model's weights in turn: Keras traces a
        model's test step once, so a new model per evaluation meant a new trace of the same
        computation each time (and TensorFlow's "triggered tf.function retracing" warning)."""
        if self._scorer is None:
            self._scorer = build_model(self.config, self.test_res, self.num_classes)
            compile_model(self._scorer, "sgd", self.config, self.num_classes)
        return self._scorer

    def one_device_copy(self, model: keras.Model) -> keras.Model:
        """A model built at the test resolution on one device with `model`'s weights."""
        copy = build_model(self.config, self.test_res, self.num_classes)
        copy.set_weights(model.get_weights())
        return copy

    def evaluate(self, model: keras.Model) -> dict:
        scorer = self.scorer()
        scorer.set_weights(model.get_weights())
        data = build_datasets(self.config, self.test_res, training=False,
                              split=self.config.eval_split, repeat=False,
                              num_classes=self.num_classes, skip_counter=self.skipped)
        with reporting_data_errors(self.skipped):
            scores = evaluate(scorer, data, self.eval_steps)
            if self.config.eval_flip:
                if self._mirrored is None:  # the scorer's layers: its weights, one trace
                    self._mirrored = flip_averaged(scorer)
                    compile_model(self._mirrored, "sgd", self.config, self.num_classes)
                flipped = evaluate(self._mirrored, data, self.eval_steps)
                scores.update({f"flip_{key}": value for key, value in flipped.items()})
        return scores

    def evaluate_and_finetune(self, model: keras.Model, weights_from: str) -> keras.Model:
        """Evaluates `model` (top-1 before the fine-tune in the finetune modes), fine-tunes
        and evaluates again where the mode asks; returns the model to save."""
        config, runtime = self.config, self.runtime
        # A model built under a strategy is evaluated through a one-device copy (Keras'
        # evaluate is not made for multi-worker strategies; every process gets the same result).
        evaluated = model  # evaluate/finetune modes built it at the test resolution
        if model.input_shape[1] != self.test_res or not runtime.evaluates_in_place:
            evaluated = self.one_device_copy(model)
        compile_model(evaluated, "sgd", config, self.num_classes)
        before = self.evaluate(evaluated)
        finetunes = MODE_TABLE[config.mode].finetunes
        self.results.update(test_resolution=self.test_res, weights=weights_from,
                            **{f"{k}_before_finetune" if finetunes else k: v
                               for k, v in before.items()})
        if not finetunes:
            return evaluated
        if config.finetune_epochs == 0:
            self.results.update(before)
            return evaluated
        return self.finetune(model)

    def finetune(self, model: keras.Model) -> keras.Model:
        config, runtime = self.config, self.runtime
        tuned, info = finetune(config, model.get_weights(), self.num_classes,
                               self.train_examples, runtime=runtime, skip_counter=self.skipped,
                               watch=self.session.watch, optimizer_slots=self.slots)
        if not runtime.evaluates_in_place:
            tuned = self.one_device_copy(tuned)
            compile_model(tuned, "sgd", config, self.num_classes)
        after = self.evaluate(tuned)
        self.results.update(finetune_epochs=config.finetune_epochs,
                            finetune_global_batch_size=info["global_batch_size"],
                            finetune_images_per_second=info["images_per_second"], **after)
        if runtime.is_chief:
            save_weights_atomically(tuned, RunFiles(config.model_dir).finetuned_weights)
            # It competes for best.keras with the training phase's validations.
            self.results["best"] = finetuned_competes(config, tuned, after)
        return tuned


def train(config: TrainConfig, num_classes: int, train_examples: int,
          extra_callbacks: list | None = None, runtime=None, skip_counter=None,
          watch: SignalWatch | None = None, eval_steps: int | None = None) -> dict:
    """Trains at the training resolution with checkpoints and resume; returns a summary.

    Resumes from the newest healthy checkpoint in model_dir (unless `--noresume`), also from
    the middle of an epoch, at exactly the uninterrupted run's state: weights, optimizer,
    random-generator states (dropout, stochastic depth), the data position (the runtime rebuilds
    the seeded pipeline and skips the batches already trained on) and the epoch's running
    metrics. A SIGTERM or SIGINT checkpoints the current step and raises `Preempted`.

    `extra_callbacks` run after the checkpoint is written at each epoch's end. `runtime`
    (default: one device) places the model and runs the steps; only its chief process writes
    checkpoints and TensorBoard logs. `watch` is the run's `SignalWatch` (its `RunSession`'s);
    without one, this call installs its own for its length. `eval_steps`: the batches each
    validation scores (the caller's count; default --eval_steps, else the split is counted).
    """
    runtime = runtime if runtime is not None else OneDevice(config.plan)
    plan = config.plan
    train_res, _ = resolutions(config)
    updates = plan.updates_per_epoch(train_examples, config.updates_per_epoch)
    step_calls = plan.step_calls_per_epoch(updates)
    manager = CheckpointManager(RunFiles(config.model_dir).checkpoints, config.keep_checkpoints)
    latest = resume_point(config, manager, num_classes, runtime.is_chief)
    keras.utils.set_random_seed(config.seed)
    model, state = _model_to_train(config, runtime, train_res, num_classes, updates, latest)
    average = (SlotAverage(config.weight_average_decay, state.get("average"))
               if config.weight_average_decay > 0 else None)
    throughput = Throughput(plan.examples_per_step_call, plan.step_calls_per_execution)
    left = config.epochs - state.get("epoch", 0)
    log.info("training: %d epoch%s of %d updates at %dpx on %d %s images of %s, %d classes "
             "(the first step traces the model: the slowest)", left, "" if left == 1 else "s",
             updates, train_res, train_examples, config.train_split, config.dataset,
             num_classes)
    with contextlib.nullcontext(watch) if watch is not None else SignalWatch() as watch:
        validation = (Validation(config, num_classes, eval_steps or config.eval_steps or None,
                                 skip_counter)
                      if config.eval_every and runtime.is_chief else None)
        guards, history, epoch_end = _train_callbacks(
            config, runtime, manager, state, step_calls=step_calls, num_classes=num_classes,
            watch=watch, average=average, validation=validation)
        callbacks = [throughput, *guards, *epoch_end, *_tensorboard(config, runtime),
                     *_metrics_csv(config, runtime), *(extra_callbacks or [])]

        # The runtime skips the batches already seen (the pipeline is seeded, so a resumed run
        # sees exactly what the uninterrupted one would) and shards the input where it has to.
        def make_dataset(input_context):
            return build_datasets(config, train_res, training=True, split=config.train_split,
                                  repeat=True, num_classes=num_classes,
                                  input_context=input_context, skip_counter=skip_counter)

        with watch.deferred(), reporting_data_errors(skip_counter):
            _fit_epochs(runtime, model, make_dataset, epochs=config.epochs,
                        step_calls=step_calls, state=state, watch=watch,
                        callbacks=callbacks, verbose=config.verbose)
    return {"model": model, "average": average, "history": history.epochs,
            "best": validation.best if validation is not None else None,
            "images_per_second": throughput.images_per_second,
            "resolution": train_res, "step_calls_per_epoch": step_calls,
            "updates_per_epoch": updates, "checkpoint": manager.latest()}


def _model_to_train(config: TrainConfig, runtime, resolution: int, num_classes: int,
                    updates: int, latest: Path | None) -> tuple[keras.Model, dict]:
    """The compiled model under `runtime`, restored from `latest` when resuming; and the
    restored state (epoch, batch, history, weight average, metrics; empty for a new run)."""
    with runtime.scope():
        model = build_model(config, resolution, num_classes)
        if latest is None and config.weights:  # a new run from pretrained weights
            warm_start(model, config)
        runtime.attach(model)
        schedule = lr_schedule(config, config.plan.optimizer_applies_per_epoch(updates),
                               config.epochs, config.peak_learning_rate())
        compile_model(model, build_optimizer(config, schedule), config, num_classes)
        if latest is None:
            return model, {}
        state = CheckpointManager.restore(latest, model, model.optimizer)
        log.info("resumed from %s (epoch %d, batch %d)", latest, state["epoch"], state["batch"])
        if state.get("metrics") is not None:
            build_metrics(model, config, resolution, num_classes)
    return model, state


def _train_callbacks(config: TrainConfig, runtime, manager: CheckpointManager, state: dict,
                     *, step_calls: int, num_classes: int, watch, average,
                     validation=None) -> tuple[list, EpochHistory, list]:
    """The loss guards (NaN, divergence), the run's history, and the epoch-end callbacks in
    their order: the restored metric sums of a resumed partial epoch, the weight average,
    validation, the history, then the checkpointer, which runs after the guards so that a bad
    step is never saved as good, and after the others so that it saves what they computed."""
    start = dict(initial_epoch=state.get("epoch", 0), initial_batch=state.get("batch", 0))
    health = (DivergenceGuard(num_classes, config.divergence_factor, config.divergence_steps,
                              step_calls, checkpoints=manager, **start)
              if config.divergence_factor > 0 else None)
    history = EpochHistory(state.get("history", []))
    # Other workers keep the weight average and history but write nothing.
    checkpointer = Checkpointer(
        manager if runtime.is_chief else None,
        Contents({"config": config.to_dict(), "num_classes": num_classes}, history.epochs,
                 average),
        Position(step_calls, **start),
        every=SaveEvery(config.checkpoint_steps, config.checkpoint_minutes), watch=watch,
        health=health, directory=manager.directory,
        after_save=validation.saved if validation is not None else None)
    epoch_end = [
        *([RestoredMetrics(state["metrics"], start["initial_epoch"])]
          if state.get("metrics") is not None and start["initial_batch"] else []),
        *([Averaging(average)] if average is not None else []),
        *([Validating(validation, average)] if validation is not None else []),
        history, checkpointer]
    guard = NonFiniteLossGuard(step_calls, checkpoints=manager, **start)
    return [guard, *([health] if health else [])], history, epoch_end


def _tensorboard(config: TrainConfig, runtime) -> list:
    """TensorBoard's callback on the chief (per-epoch logs in model_dir/logs)."""
    if not runtime.is_chief:
        return []
    return [keras.callbacks.TensorBoard(str(RunFiles(config.model_dir).logs),
                                        update_freq="epoch")]


def _metrics_csv(config: TrainConfig, runtime) -> list:
    """metrics.csv on the chief: one row per epoch (training/reporting.py)."""
    if not runtime.is_chief:
        return []
    return [MetricsCSV(RunFiles(config.model_dir).metrics)]


def _fit_epochs(runtime, model: keras.Model, make_dataset, *, epochs: int, step_calls: int,
                state: dict, watch: SignalWatch, **fit) -> None:
    """Runs the epochs left: first the rest of an interrupted epoch (its own `fit`, from the
    global step call where it stopped), then whole epochs."""
    epoch, batch = state.get("epoch", 0), state.get("batch", 0)
    if batch and epoch < epochs:
        with fit_does_not_finalize(model.optimizer):
            runtime.fit(model, make_dataset, epochs=epoch + 1, initial_epoch=epoch,
                        step_calls_per_epoch=step_calls - batch,
                        start_step=epoch * step_calls + batch, watch=watch, **fit)
        epoch += 1
    if epoch < epochs:
        runtime.fit(model, make_dataset, epochs=epochs, initial_epoch=epoch,
                    step_calls_per_epoch=step_calls, watch=watch, **fit)


__all__ = ["HEAD_LAYERS", "build_datasets", "build_model", "build_optimizer", "class_names",
           "compile_model", "dataset_facts", "evaluate", "finetune", "finetune_config",
           "finetune_schedule", "input_options", "load_weights_for", "lr_schedule",
           "precision_policy", "resolutions", "save_outputs", "train", "train_and_evaluate",
           "use_one_hot"]
