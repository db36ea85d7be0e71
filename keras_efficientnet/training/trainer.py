"""The trainer: small named builders and `train_and_evaluate`, which runs a config's mode."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
import warnings
from pathlib import Path

import keras

from keras_efficientnet import optimizers as opt_lib
from keras_efficientnet.atomic import write_atomically
from keras_efficientnet.models.efficientnet import SCALING, EfficientNet
from keras_efficientnet.models.presets import preset_config
from keras_efficientnet.training import preemption, run_dir
from keras_efficientnet.training.callbacks import (
    Checkpointer,
    DivergenceGuard,
    NonFiniteLossGuard,
    Throughput,
)
from keras_efficientnet.training.checkpoint import WEIGHTS, CheckpointManager
from keras_efficientnet.training.config import ARCHITECTURE_FIELDS, TrainConfig
from keras_efficientnet.training.export import (
    export_saved_model,
    inference_model,
    save_model,
    save_weights_atomically,
)
from keras_efficientnet.training.optimizer_state import SlotAverage, read_slots, restore_slots
from keras_efficientnet.training.runtime import OneDevice, starting_at_step

log = logging.getLogger("keras_efficientnet")

# Layers the reduced-resolution fine-tune trains: the head conv, its norm (and proxy norm
# activation) and the classifier. Everything else is frozen.
HEAD_LAYERS = ("head_conv", "head_norm", "head_act", "predictions")


def _runtime_or_one_device(config: TrainConfig, runtime):
    """`runtime`, or the one-device runtime when the config's plan needs no other."""
    return runtime if runtime is not None else OneDevice(config.plan)


def resolutions(config: TrainConfig) -> tuple[int, int]:
    """(train, test) resolutions, 0 meaning the variant's native resolution."""
    native = SCALING[preset_config(config.model)["variant"]].resolution
    train = config.train_resolution or native
    test = config.test_resolution or native
    if config.mode == "train_and_finetune" and train % 32 != test % 32:
        warnings.warn(
            f"--train_resolution={train} and --test_resolution={test} differ modulo 32 "
            f"({train % 32} vs {test % 32}); the paper picks train_res so that they agree, "
            "which keeps the feature maps' alignment.", stacklevel=2)
    return train, test


def use_one_hot(config: TrainConfig) -> bool:
    return config.label_smoothing > 0 or config.mixup_alpha > 0 or config.cutmix_lambda > 0


def build_model(config: TrainConfig, resolution: int, num_classes: int) -> EfficientNet:
    """The preset architecture at `resolution` with `num_classes` outputs."""
    overrides = {"drop_connect_rate": config.drop_connect_rate}
    if config.dropout_rate >= 0:
        overrides["dropout_rate"] = config.dropout_rate
    # Logits out: the losses take `from_logits=True`, which stays exact when the softmax would
    # saturate (Keras clips probabilities on backends that cannot recover the logits).
    return EfficientNet.from_preset(config.model, input_shape=(resolution, resolution, 3),
                                    classes=num_classes, classifier_activation=None,
                                    **overrides)


# Graphcore's exponential and cosine schedules count their decay from step 0, warm-up
# included; its polynomial (LARS) schedule decays from the end of warm-up.
DECAY_FROM_START = ("exponential", "cosine")


def lr_schedule(config: TrainConfig, steps_per_epoch: int, epochs: int,
                peak: float) -> opt_lib.WarmupSchedule:
    """Warm-up and the configured decay in optimizer steps (`plan.optimizer_steps_per_epoch`:
    Keras' accumulating optimizer counts every micro-batch), shaped as Graphcore's schedules:
    see `DECAY_FROM_START`."""
    total = max(1, epochs * steps_per_epoch)
    from_start = config.lr_schedule in DECAY_FROM_START
    warmup = int(round(config.warmup_epochs * steps_per_epoch))
    if not from_start:
        warmup = min(warmup, total - 1)
    kwargs = {}
    if config.lr_schedule == "exponential":
        kwargs = dict(decay_steps=max(config.decay_epochs * steps_per_epoch, 1e-9),
                      decay_rate=config.decay_rate)
    elif config.lr_schedule in ("cosine", "polynomial"):
        kwargs = dict(total_steps=total, end_learning_rate=peak * config.end_learning_rate_ratio,
                      power=config.poly_power if config.lr_schedule == "polynomial" else 1.0)
    return opt_lib.WarmupSchedule(peak, warmup, config.lr_schedule,
                                  decay_from_start=from_start, **kwargs)


def build_optimizer(config: TrainConfig, schedule) -> keras.optimizers.Optimizer:
    """RMSPropTF, LARS or momentum SGD with the config's weight decay, accumulating where the
    plan leaves accumulation to the optimizer (one unsplit device)."""
    common = {}
    if config.plan.optimizer_accumulation > 1:
        common["gradient_accumulation_steps"] = config.plan.optimizer_accumulation
    if config.ema_decay > 0:
        common.update(use_ema=True, ema_momentum=config.ema_decay)
    if config.optimizer == "rmsprop":
        return opt_lib.RMSPropTF(schedule, rho=config.rmsprop_rho, momentum=config.momentum,
                                 epsilon=config.rmsprop_epsilon,
                                 weight_decay_l2=config.weight_decay, **common)
    if config.optimizer == "lars":
        return opt_lib.LARS(schedule, momentum=config.momentum, eta=config.lars_eta,
                            epsilon=config.lars_epsilon, weight_decay_l2=config.weight_decay,
                            **common)
    return opt_lib.SGD(schedule, momentum=config.momentum, weight_decay_l2=config.weight_decay,
                       **common)


def compile_model(model: keras.Model, optimizer, config: TrainConfig, num_classes: int) -> None:
    """Loss with label smoothing, top-1/top-5 metrics, XLA off (slower on CPU)."""
    k = min(5, num_classes)
    if use_one_hot(config):
        loss = keras.losses.CategoricalCrossentropy(from_logits=True,
                                                    label_smoothing=config.label_smoothing)
        metrics = [keras.metrics.CategoricalAccuracy(name="top1"),
                   keras.metrics.TopKCategoricalAccuracy(k, name="top5")]
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        metrics = [keras.metrics.SparseCategoricalAccuracy(name="top1"),
                   keras.metrics.SparseTopKCategoricalAccuracy(k, name="top5")]
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics, jit_compile=False,
                  steps_per_execution=config.plan.steps_per_execution)


def input_options(config: TrainConfig):
    """The config's input settings as one `datasets.InputOptions` (the one place config fields
    become pipeline options), set up for evaluation; each phase replaces the split, resolution,
    batch size and whether it trains (`build_datasets`)."""
    from keras_efficientnet.datasets import InputOptions

    return InputOptions(
        config.dataset, config.eval_split, image_size=1, batch_size=1, training=False,
        data_dir=config.data_dir or None, mixup_alpha=config.mixup_alpha,
        cutmix_lambda=config.cutmix_lambda or None, cutmix_version=config.cutmix_version,
        one_hot=use_one_hot(config), shuffle_buffer=config.shuffle_buffer or None,
        cache=config.cache, seed=config.seed, deterministic=config.deterministic or None,
        private_threadpool_size=config.host_threads or None,
        eval_resize_ratio=config.eval_resize_ratio, area_range=(config.crop_area_min, 1.0),
        random_flip=config.random_flip, allow_empty_classes=config.allow_empty_classes)


def build_datasets(config: TrainConfig, resolution: int, *, training: bool, split: str,
                   repeat: bool, num_classes: int | None = None, augment: bool | None = None,
                   input_context=None, mix: bool | None = None, skip_counter=None):
    """The host pipeline for one phase; `augment=False` gives eval preprocessing, shuffled, and
    `mix` applies the config's Mixup/CutMix (default: when augmenting).

    Training batches hold one step of the plan (`plan.examples_per_step`); with an
    `input_context` (a `tf.distribute.InputContext` from the runtime) this pipeline reads only its
    shard and yields the per-replica share. Evaluation batches hold `plan.forward_batch_size`.
    Unreadable images are counted in `skip_counter` (a `datasets.SkipCounter`; default: the
    pipeline's own).
    """
    from keras_efficientnet import datasets

    augment = training if augment is None else augment
    mix = augment if mix is None else mix
    options = input_options(config).replace(
        split=split, image_size=resolution, training=training, augment=augment, mix=mix,
        repeat=repeat, num_classes=num_classes,
        batch_size=config.plan.examples_per_step if training else config.plan.forward_batch_size)
    return datasets.make_dataset(options, input_context=input_context, skip_counter=skip_counter)


def class_names(config: TrainConfig) -> tuple[str, ...] | None:
    """The class names of the configured source, in label order, where it records them."""
    from keras_efficientnet import datasets

    return datasets.dataset_info(config.dataset, config.eval_split,
                                 allow_empty_classes=config.allow_empty_classes,
                                 data_dir=config.data_dir or None).class_names


def save_outputs(config: TrainConfig, model: keras.Model) -> dict:
    """Writes `<model_dir>/model.keras` after training (and the SavedModel of --export_dir);
    returns their paths for results.json. Both hold the model with a softmax classifier."""
    written = {}
    final = inference_model(model)
    if config.mode != "evaluate":
        written["model_file"] = str(save_model(final, config.model_dir, class_names(config)))
    if config.export_dir:
        written["export_dir"] = str(export_saved_model(final, config.export_dir))
    return written


def dataset_facts(config: TrainConfig) -> tuple[int, int, int]:
    """(train examples, eval examples, classes) of the configured source."""
    from keras_efficientnet import datasets

    data_dir = config.data_dir or None
    allow = config.allow_empty_classes
    train = datasets.dataset_info(config.dataset, config.train_split, data_dir=data_dir,
                                  allow_empty_classes=allow)
    held_out = datasets.dataset_info(config.dataset, config.eval_split, data_dir=data_dir,
                                     allow_empty_classes=allow)
    return train.num_examples, held_out.num_examples, train.num_classes


@contextlib.contextmanager
def precision_policy(precision: str):
    """Sets Keras' global dtype policy for the models built inside, then restores it."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _check_architecture(saved: dict, config: TrainConfig, where: Path) -> None:
    differing = [f"{name} (checkpoint {saved.get(name)!r}, now {getattr(config, name)!r})"
                 for name in ARCHITECTURE_FIELDS if saved.get(name) != getattr(config, name)]
    if differing:
        raise ValueError(
            f"the checkpoint in {where} was trained with another architecture: "
            f"{'; '.join(differing)}. Use another --model_dir, or --noresume to start afresh.")


def _check_classes(saved: dict, num_classes: int, config: TrainConfig, where: Path) -> None:
    if saved.get("num_classes", num_classes) != num_classes:
        raise ValueError(
            f"the checkpoint in {where} was trained on {saved['num_classes']} classes but "
            f"--dataset={config.dataset} has {num_classes}. Use another --model_dir, or "
            "--noresume to start afresh (the earlier run is moved to model_dir/previous/).")


def _resume_point(config: TrainConfig, manager: CheckpointManager, num_classes: int,
                  chief: bool = True) -> Path | None:
    """The checkpoint to resume from (the newest intact healthy one, verified against its
    manifest; the chief moves damaged ones aside), checked against the config."""
    latest = manager.resume_point(move_damaged=chief) if config.resume else None
    if latest is None:
        return None
    saved = CheckpointManager.read_state(latest)
    _check_architecture(saved["config"], config, latest)
    _check_classes(saved, num_classes, config, latest)
    return latest


def evaluate(model: keras.Model, dataset, steps: int | None, verbose: int = 0) -> dict:
    """Top-1 and top-5 of `model` on `dataset`."""
    results = model.evaluate(dataset, steps=steps, verbose=verbose, return_dict=True)
    return {"top1": float(results["top1"]), "top5": float(results["top5"]),
            "loss": float(results["loss"])}


@contextlib.contextmanager
def _reporting_data_errors(skip_counter):
    """Re-raises a dataset's NoReadableImagesError as itself, not wrapped by TensorFlow."""
    try:
        yield
    except Exception:
        if skip_counter is not None and skip_counter.error is not None:
            raise skip_counter.error from None
        raise


def _build_metrics(model: keras.Model, config: TrainConfig, resolution: int,
                   num_classes: int) -> None:
    # Keras creates the compiled metrics' variables at the first training step; a resumed
    # partial epoch puts their running sums back before it, so create them now (on one
    # inference-mode example: no random draws, so the restored generator states stay as saved).
    x = keras.ops.zeros((1, resolution, resolution, 3), "uint8")
    y = (keras.ops.zeros((1, num_classes)) if use_one_hot(config)
         else keras.ops.zeros((1,), "int32"))
    model.compute_metrics(x, y, model(x, training=False))


@contextlib.contextmanager
def _fit_does_not_finalize(optimizer):
    # Keras' fit ends by swapping the EMA weights into the model (finalize_variable_values): the
    # partial first epoch of a resumed run is not the end of training.
    optimizer.finalize_variable_values = lambda *args, **kwargs: None
    try:
        yield
    finally:
        del optimizer.finalize_variable_values


def _train_callbacks(config: TrainConfig, runtime, manager: CheckpointManager, state: dict,
                     *, steps: int, num_classes: int, watch, average) -> tuple[list, Checkpointer]:
    """The loss guards (NaN, divergence) and the checkpointer, which runs after them so that a
    bad step is never saved as good."""
    start = dict(initial_epoch=state.get("epoch", 0), initial_batch=state.get("batch", 0))
    health = (DivergenceGuard(num_classes, config.divergence_factor, config.divergence_steps,
                              steps, checkpoints=manager, **start)
              if config.divergence_factor > 0 else None)
    # Other workers keep the weight average and history but write nothing.
    checkpointer = Checkpointer(
        manager if runtime.is_chief else None, average,
        {"config": config.to_dict(), "num_classes": num_classes}, steps,
        history=state.get("history", []), every_steps=config.checkpoint_steps,
        every_minutes=config.checkpoint_minutes, watch=watch, health=health,
        metrics=state.get("metrics"), directory=manager.directory, **start)
    guard = NonFiniteLossGuard(steps, steps_per_execution=config.plan.steps_per_execution,
                               checkpoints=manager, **start)
    return [guard, *([health] if health else [])], checkpointer


def train(config: TrainConfig, num_classes: int, train_examples: int,
          extra_callbacks: list | None = None, runtime=None, skip_counter=None) -> dict:
    """Trains at the training resolution with checkpoints and resume; returns a summary.

    Resumes from the newest healthy checkpoint in model_dir (unless `--noresume`), also from
    the middle of an epoch, at exactly the uninterrupted run's state: weights, optimizer,
    random-generator states (dropout, stochastic depth), the data position (the runtime rebuilds
    the seeded pipeline and skips the batches already trained on) and the epoch's running
    metrics. A SIGTERM or SIGINT checkpoints the current step and raises `Preempted`.

    `extra_callbacks` run after the checkpoint is written at each epoch's end. `runtime`
    (default: one device) places the model and runs the steps; only its chief process writes
    checkpoints and TensorBoard logs.
    """
    runtime = _runtime_or_one_device(config, runtime)
    plan = config.plan
    train_res, _ = resolutions(config)
    updates = plan.updates_per_epoch(train_examples, config.steps_per_epoch)
    steps = plan.host_steps_per_epoch(updates)
    manager = CheckpointManager(Path(config.model_dir) / "checkpoints", config.keep_checkpoints)
    latest = _resume_point(config, manager, num_classes, runtime.is_chief)
    state = {}
    keras.utils.set_random_seed(config.seed)
    with runtime.scope():
        model = build_model(config, train_res, num_classes)
        runtime.attach(model)
        schedule = lr_schedule(config, plan.optimizer_steps_per_epoch(updates), config.epochs,
                               config.peak_learning_rate())
        optimizer = build_optimizer(config, schedule)
        compile_model(model, optimizer, config, num_classes)
        if latest is not None:
            model.optimizer.build(model.trainable_variables)
            state = CheckpointManager.restore(latest, model, model.optimizer)
            log.info("resumed from %s (epoch %d, batch %d)", latest, state["epoch"],
                     state["batch"])
            if state.get("metrics") is not None:
                _build_metrics(model, config, train_res, num_classes)
    epoch, batch = state.get("epoch", 0), state.get("batch", 0)
    average = (SlotAverage(config.weight_average_decay, state.get("average"))
               if config.weight_average_decay > 0 else None)
    throughput = Throughput(plan.examples_per_step, plan.steps_per_execution)
    with preemption.watching() as watch:
        guards, checkpointer = _train_callbacks(
            config, runtime, manager, state, steps=steps, num_classes=num_classes, watch=watch,
            average=average)
        callbacks = [throughput, *guards, checkpointer]
        if runtime.is_chief:
            callbacks.append(keras.callbacks.TensorBoard(str(Path(config.model_dir) / "logs"),
                                                         update_freq="epoch"))
        callbacks += extra_callbacks or []

        # The runtime skips the batches already seen (the pipeline is seeded, so a resumed run
        # sees exactly what the uninterrupted one would) and shards the input where it has to.
        def make_dataset(input_context):
            return build_datasets(config, train_res, training=True, split=config.train_split,
                                  repeat=True, num_classes=num_classes,
                                  input_context=input_context, skip_counter=skip_counter)

        fit = dict(callbacks=callbacks, verbose=config.verbose)
        with watch.deferred(), _reporting_data_errors(skip_counter):
            if batch and epoch < config.epochs:  # the rest of an interrupted epoch first
                with _fit_does_not_finalize(model.optimizer), starting_at_step(
                        epoch * steps + batch):
                    runtime.fit(model, make_dataset, epochs=epoch + 1, initial_epoch=epoch,
                                steps_per_epoch=steps - batch, **fit)
                epoch += 1
            if epoch < config.epochs:
                runtime.fit(model, make_dataset, epochs=config.epochs, initial_epoch=epoch,
                            steps_per_epoch=steps, **fit)
    return {"model": model, "average": average, "history": checkpointer.history,
            "images_per_second": throughput.images_per_second,
            "resolution": train_res, "steps_per_epoch": steps,
            "checkpoint": manager.latest()}


def load_weights_for(config: TrainConfig, model: keras.Model, averaged: bool = True,
                     slots: list | None = None) -> str:
    """Loads --init_checkpoint, else model_dir's latest good checkpoint (averaged weights
    first). `slots`, a list, receives the optimizer slots averaged with those weights."""
    source = config.init_checkpoint or ""
    if not source:
        latest = CheckpointManager(Path(config.model_dir) / "checkpoints").resume_point(
            move_damaged=False)
        if latest is None:
            raise ValueError(
                f"--mode={config.mode} needs trained weights: no checkpoint in "
                f"{Path(config.model_dir) / 'checkpoints'} and no --init_checkpoint given")
        source = str(latest)
    path = Path(source)
    if path.is_dir():
        saved = CheckpointManager.read_state(path)
        _check_architecture(saved["config"], config, path)
        _check_classes(saved, model.output_shape[-1], config, path)
        state = CheckpointManager.restore(path, model)
        if averaged and state.get("average") is not None:
            average = SlotAverage(0.0, state["average"])
            model.set_weights(average.weights_like(model))
            if slots is not None:
                slots.extend(average.slots(model) or ())
            return f"{path} (weight average)"
        return str(path)
    if not path.is_file():
        raise ValueError(f"--init_checkpoint={source!r} is neither a checkpoint folder nor a "
                         f"{WEIGHTS!r}-style weights file")
    try:
        model.load_weights(path)
    except ValueError as error:  # Keras prints the tensors: keep its first line
        raise ValueError(f"--init_checkpoint={source!r} does not fit --model={config.model} "
                         f"with {model.output_shape[-1]} classes: "
                         f"{str(error).strip().splitlines()[0]}") from None
    return str(path)


def finetune_config(config: TrainConfig) -> TrainConfig:
    """The config of the fine-tune phase: its batch (`TrainConfig.finetune_accumulation`; the
    micro-batch, replicas, strategy and stages stay), RMSProp's rho rescaled to that batch as
    Graphcore derives it (1 - rho linear in the batch: 0.953125 at 768, 0.96875 at 512), no
    per-step weight EMA."""
    ratio = config.finetune_global_batch_size / config.global_batch_size
    return config.replace(gradient_accumulation=config.finetune_accumulation(),
                          rmsprop_rho=1.0 - (1.0 - config.rmsprop_rho) * ratio, ema_decay=0.0)


def finetune_schedule(config: TrainConfig, steps_per_epoch: int) -> opt_lib.WarmupSchedule:
    """Graphcore's fine-tune rate: cosine to 0 over `finetune_epochs` counted from step 0,
    under a linear warm-up of `finetune_warmup_epochs` (which may outlast the fine-tune), peak
    `finetune_learning_rate`, else `finetune_learning_rate_per_sample` x its batch.
    `steps_per_epoch` counts optimizer steps (`plan.optimizer_steps_per_epoch`)."""
    peak = (config.finetune_learning_rate or
            config.finetune_learning_rate_per_sample * config.finetune_global_batch_size)
    shape = config.replace(lr_schedule="cosine", warmup_epochs=config.finetune_warmup_epochs,
                           end_learning_rate_ratio=0.0)
    return lr_schedule(shape, steps_per_epoch, config.finetune_epochs, peak)


@contextlib.contextmanager
def _runtime_plan(runtime, plan):
    """Runs `runtime` with `plan` (the fine-tune's: same strategy, replicas and stages, another
    accumulation), then gives it back its own; runtimes read their plan when they attach and
    fit."""
    own = runtime.plan
    runtime.plan = plan
    try:
        yield
    finally:
        runtime.plan = own


def finetune(config: TrainConfig, model_weights: list, num_classes: int,
             train_examples: int, runtime=None, skip_counter=None,
             optimizer_slots: list | None = None) -> tuple[keras.Model, dict]:
    """Graphcore's fine-tune (their README, section 5; `--variable-filter Top`): only the head
    block trains, at the test resolution, on training images with evaluation preprocessing and
    the run's Mixup/CutMix, from `model_weights` (the weight average), at the fine-tune batch
    (`finetune_config`) and rate (`finetune_schedule`), under `runtime`. `optimizer_slots`
    (the training optimizer's, averaged with the weights: `optimizer_state`) start the head's
    optimizer state, as Graphcore's restore of the averaged checkpoint does; None: fresh.

    It writes no checkpoints (a few head-only epochs): a run stopped here redoes it."""
    runtime = _runtime_or_one_device(config, runtime)
    tuned = finetune_config(config)
    plan = tuned.plan
    _, test_res = resolutions(config)
    keras.utils.set_random_seed(config.seed + 1)
    updates = plan.updates_per_epoch(train_examples, config.steps_per_epoch)
    steps = plan.host_steps_per_epoch(updates)
    with _runtime_plan(runtime, plan):
        with runtime.scope():
            model = build_model(config, test_res, num_classes)
            model.set_weights(model_weights)
            trained_variables = list(model.trainable_variables)
            for layer in model.layers:
                layer.trainable = layer.name in HEAD_LAYERS
            runtime.attach(model)
            schedule = finetune_schedule(config, plan.optimizer_steps_per_epoch(updates))
            compile_model(model, build_optimizer(tuned, schedule), tuned, num_classes)
            if optimizer_slots:
                restore_slots(model.optimizer, trained_variables, optimizer_slots,
                              model.trainable_variables)
        throughput = Throughput(plan.examples_per_step, plan.steps_per_execution)

        def make_dataset(input_context):
            return build_datasets(tuned, test_res, training=True, augment=False, mix=True,
                                  split=config.train_split, repeat=True,
                                  num_classes=num_classes, input_context=input_context,
                                  skip_counter=skip_counter)

        guards = [NonFiniteLossGuard(steps, steps_per_execution=plan.steps_per_execution)]
        if config.divergence_factor > 0:
            guards.append(DivergenceGuard(num_classes, config.divergence_factor,
                                          config.divergence_steps, steps))
        with _reporting_data_errors(skip_counter):
            history = runtime.fit(model, make_dataset, epochs=config.finetune_epochs,
                                  steps_per_epoch=steps, callbacks=[throughput, *guards],
                                  verbose=config.verbose)
    return model, {"history": history.history, "images_per_second":
                   throughput.images_per_second, "resolution": test_res,
                   "global_batch_size": plan.global_batch_size}


def _json_safe(value):
    """`value` with NaN and infinities as null and NumPy scalars as Python numbers (strict
    JSON: Python's json writes NaN, which other readers reject)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _write_results(config: TrainConfig, results: dict) -> Path:
    return write_atomically(Path(config.model_dir) / run_dir.results_name(config.mode),
                            json.dumps(_json_safe(results), indent=2, sort_keys=True,
                                       allow_nan=False))


def _summary_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


def _rate(value) -> str:
    return f"{value:.1f} img/s" if value is not None and math.isfinite(value) else (
        "no steps run (already trained)")


def _summary(config: TrainConfig, results: dict, path: Path) -> str:
    train_res, test_res = results.get("train_resolution"), results["test_resolution"]
    rows = [("mode", config.mode), ("model", config.model), ("dataset", config.dataset),
            ("global batch", str(config.global_batch_size))]
    if "epochs" in results:
        rows.append(("trained", f"{config.epochs} epochs at {train_res}px, "
                                f"{_rate(results['images_per_second'])}"))
    if config.mode.endswith("finetune"):
        rows.append(("before fine-tune", f"top-1 {results['top1_before_finetune']:.4f} at "
                                         f"{test_res}px"))
        if config.finetune_epochs > 0:
            rows.append(("fine-tuned", f"{config.finetune_epochs} epochs, head only, "
                                       f"at {test_res}px, batch "
                                       f"{config.finetune_global_batch_size}"))
    rows += [("top-1", f"{results['top1']:.4f}"), ("top-5", f"{results['top5']:.4f}")]
    if results.get("skipped_images"):
        rows.append(("skipped images", f"{results['skipped_images']} unreadable"))
    rows += [("wall time", f"{results['wall_seconds']:.0f} s"), ("results", str(path))]
    rows += [(label, results[key]) for label, key in (("model file", "model_file"),
                                                      ("SavedModel", "export_dir"))
             if key in results]
    return "\n" + _summary_table(rows)


def train_and_evaluate(config: TrainConfig, runtime=None) -> dict:
    """Runs `config.mode` and writes its results file in model_dir; returns the results.

    `results.json` for train and train_and_finetune; `results-evaluate.json` and
    `results-finetune.json` for the modes that reuse an earlier run's weights. The run owns
    model_dir while it runs (`run_dir.owned`: checked, locked, fresh-run rule) and turns SIGTERM
    and SIGINT into a checkpoint at the current step (`preemption.Preempted`).

    `runtime` places training and fine-tuning (default: one device; see
    `keras_efficientnet.distribute.run`, which builds it from the config). Evaluation runs on
    one device in every process; only the chief process writes results and weights.
    """
    started = time.perf_counter()
    runtime = _runtime_or_one_device(config, runtime)
    with run_dir.owned(config, chief=runtime.is_chief), preemption.watching():
        return _run_mode(config, runtime, started)


def _run_mode(config: TrainConfig, runtime, started: float) -> dict:
    from keras_efficientnet.datasets import SkipCounter

    skipped = SkipCounter()
    train_examples, eval_examples, num_classes = dataset_facts(config)
    train_res, test_res = resolutions(config)
    # Counting the batches keeps Keras from warning that a finite dataset "ran out of data".
    eval_steps = config.eval_steps or -(-eval_examples // config.plan.forward_batch_size)
    results = {"mode": config.mode, "model": config.model, "dataset": config.dataset,
               "global_batch_size": config.global_batch_size, "num_classes": num_classes,
               "train_examples": train_examples, "eval_examples": eval_examples,
               "config": config.to_dict()}
    with precision_policy(config.precision):
        model, weights_from, slots = None, "", []
        if config.mode in ("train", "train_and_finetune"):
            trained = train(config, num_classes, train_examples, runtime=runtime,
                            skip_counter=skipped)
            model = trained["model"]
            # The fine-tune's optimizer state: the slots averaged with the weights (else the last).
            slots = ((trained["average"] and trained["average"].slots(model))
                     or read_slots(model.optimizer))
            results.update(epochs=config.epochs, train_resolution=train_res,
                           images_per_second=trained["images_per_second"],
                           history=trained["history"],
                           checkpoint=str(trained["checkpoint"]) if trained["checkpoint"] else None)
            if trained["average"] is not None and trained["average"].values is not None:
                model.set_weights(trained["average"].weights_like(model))
                weights_from = "weight average"
        if config.mode in ("evaluate", "finetune"):
            keras.utils.set_random_seed(config.seed)
            model = build_model(config, test_res, num_classes)
            weights_from = load_weights_for(config, model, slots=slots)
        eval_data = lambda res: build_datasets(
            config, res, training=False, split=config.eval_split, repeat=False,
            num_classes=num_classes, skip_counter=skipped)
        evaluation_model = model  # evaluate/finetune modes built it at the test resolution
        # A model built under a strategy is evaluated through a one-device copy (Keras'
        # evaluate is not made for multi-worker strategies; every process gets the same result).
        if model.input_shape[1] != test_res or not runtime.evaluates_in_place:
            evaluation_model = build_model(config, test_res, num_classes)
            evaluation_model.set_weights(model.get_weights())
        compile_model(evaluation_model, "sgd", config, num_classes)
        final_model = evaluation_model
        with _reporting_data_errors(skipped):
            before = evaluate(evaluation_model, eval_data(test_res), eval_steps)
        results.update(test_resolution=test_res, weights=weights_from,
                       **{f"{k}_before_finetune" if config.mode.endswith("finetune") else k: v
                          for k, v in before.items()})
        if config.mode in ("finetune", "train_and_finetune") and config.finetune_epochs > 0:
            tuned, info = finetune(config, model.get_weights(), num_classes, train_examples,
                                   runtime=runtime, skip_counter=skipped, optimizer_slots=slots)
            if not runtime.evaluates_in_place:
                copy = build_model(config, test_res, num_classes)
                copy.set_weights(tuned.get_weights())
                compile_model(copy, "sgd", config, num_classes)
                tuned = copy
            final_model = tuned
            with _reporting_data_errors(skipped):
                after = evaluate(tuned, eval_data(test_res), eval_steps)
            results.update(finetune_epochs=config.finetune_epochs,
                           finetune_global_batch_size=info["global_batch_size"],
                           finetune_images_per_second=info["images_per_second"], **after)
            if runtime.is_chief:
                save_weights_atomically(tuned, Path(config.model_dir) / "finetuned.weights.h5")
        elif config.mode.endswith("finetune"):
            results.update(before)
        if runtime.is_chief:
            results.update(save_outputs(config, final_model))
    results["skipped_images"] = skipped.count
    results["wall_seconds"] = time.perf_counter() - started
    if not runtime.is_chief:
        print(f"top-1 {results['top1']:.4f}; the chief process writes the results", flush=True)
        return results
    path = _write_results(config, results)
    print(_summary(config, results, path), flush=True)
    return results


__all__ = ["build_datasets", "build_model", "build_optimizer", "compile_model", "evaluate",
           "finetune", "finetune_config", "finetune_schedule", "lr_schedule", "train",
           "train_and_evaluate"]
