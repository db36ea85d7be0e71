"""The trainer's builders: model, learning-rate schedule, optimizer, compiled losses and metrics,
input pipelines and the facts of the configured source, each from a `TrainConfig` and its plan."""

from __future__ import annotations

import contextlib
import math
import warnings

import keras

from keras_efficientnet import optimizers as opt_lib
from keras_efficientnet.models.efficientnet import EfficientNet
from keras_efficientnet.training.config import (
    ResolutionRuleWarning,
    TrainConfig,
    resolution_rule_problem,
    resolved_resolutions,
)
from keras_efficientnet.training.export import export_saved_model, inference_model, save_model
from keras_efficientnet.training.modes import MODE_TABLE


def resolutions(config: TrainConfig) -> tuple[int, int]:
    """(train, test) resolutions, 0 meaning the variant's native resolution; warns
    (ResolutionRuleWarning) when a reduced-resolution recipe breaks train = test (mod 32)."""
    problem = resolution_rule_problem(config)
    if problem:
        warnings.warn(problem, ResolutionRuleWarning, stacklevel=2)
    return resolved_resolutions(config)


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


def lr_schedule(config: TrainConfig, optimizer_applies_per_epoch: int, epochs: int,
                peak: float) -> opt_lib.WarmupSchedule:
    """Warm-up and the configured decay, counted in optimizer applies (the schedule's step:
    `plan.optimizer_applies_per_epoch`, since Keras' accumulating optimizer counts every
    micro-batch), shaped as Graphcore's schedules: see `DECAY_FROM_START`."""
    per_epoch = optimizer_applies_per_epoch
    total = max(1, epochs * per_epoch)
    from_start = config.lr_schedule in DECAY_FROM_START
    warmup = int(round(config.warmup_epochs * per_epoch))
    if not from_start:
        warmup = min(warmup, total - 1)
    kwargs = {}
    if config.lr_schedule == "exponential":
        kwargs = dict(decay_steps=max(config.decay_epochs * per_epoch, 1e-9),
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
    if config.plan.optimizer_applies_per_update > 1:
        common["gradient_accumulation_steps"] = config.plan.optimizer_applies_per_update
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
    """Loss with label smoothing, top-1/top-5 metrics, XLA off (slower on CPU), and the
    optimizer built for the model's trainable variables."""
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
                  steps_per_execution=config.plan.step_calls_per_execution)
    # The optimizer's slots now, not in the first step: without a distribution strategy Keras
    # builds them while tracing the train step, and TensorFlow then traces the step a second
    # time (a function that created variables is traced again without them).
    model.optimizer.build(model.trainable_variables)


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
        random_flip=config.random_flip, allow_empty_classes=config.allow_empty_classes,
        hold_out=config.hold_out)


def build_datasets(config: TrainConfig, resolution: int, *, training: bool, split: str,
                   repeat: bool, num_classes: int | None = None, augment: bool | None = None,
                   input_context=None, mix: bool | None = None, skip_counter=None):
    """The host pipeline for one phase; `augment=False` gives eval preprocessing, shuffled, and
    `mix` applies the config's Mixup/CutMix (default: when augmenting).

    Training batches hold one step call of the plan (`plan.examples_per_step_call`); with an
    `input_context` (a `tf.distribute.InputContext` from the runtime) this pipeline reads only its
    shard and yields the per-replica share. Evaluation batches hold one forward pass of every
    replica (`plan.examples_per_forward_pass`).
    Unreadable images are counted in `skip_counter` (a `datasets.SkipCounter`; default: the
    pipeline's own).
    """
    from keras_efficientnet import datasets

    augment = training if augment is None else augment
    mix = augment if mix is None else mix
    options = input_options(config).replace(
        split=split, image_size=resolution, training=training, augment=augment, mix=mix,
        repeat=repeat, num_classes=num_classes,
        batch_size=(config.plan.examples_per_step_call if training
                    else config.plan.examples_per_forward_pass))
    return datasets.make_dataset(options, input_context=input_context, skip_counter=skip_counter)


def split_info(config: TrainConfig, split: str):
    """The `datasets.DatasetInfo` (size, classes) of `split` of the configured source."""
    from keras_efficientnet import datasets

    return datasets.dataset_info(config.dataset, split, data_dir=config.data_dir or None,
                                 allow_empty_classes=config.allow_empty_classes,
                                 hold_out=config.hold_out)


def class_names(config: TrainConfig) -> tuple[str, ...] | None:
    """The class names of the configured source, in label order, where it records them."""
    return split_info(config, config.eval_split).class_names


def save_outputs(config: TrainConfig, model: keras.Model) -> dict:
    """Writes `<model_dir>/model.keras` after training (and the SavedModel of --export_dir);
    returns their paths for results.json. Both hold the model with a softmax classifier."""
    written = {}
    final = inference_model(model)
    if not MODE_TABLE[config.mode].scores_only:
        written["model_file"] = str(save_model(final, config.model_dir, class_names(config)))
    if config.export_dir:
        written["export_dir"] = str(export_saved_model(final, config.export_dir))
    return written


def dataset_facts(config: TrainConfig) -> tuple[int, int, int]:
    """(train examples, eval examples, classes) of the configured source."""
    train = split_info(config, config.train_split)
    held_out = split_info(config, config.eval_split)
    return train.num_examples, held_out.num_examples, train.num_classes


def evaluation_steps(config: TrainConfig, eval_examples: int) -> int:
    """Batches that score the held-out split: --eval_steps, else all `eval_examples` (counted,
    which keeps Keras from warning that a finite dataset "ran out of data")."""
    return config.eval_steps or -(-eval_examples // config.plan.examples_per_forward_pass)


def images_scored(config: TrainConfig, eval_examples: int) -> int:
    """How many of the held-out split's `eval_examples` an evaluation scores: the first
    --eval_steps batches (`evaluation_steps`) of them, else all."""
    if not config.eval_steps:
        return eval_examples
    return min(eval_examples, config.eval_steps * config.plan.examples_per_forward_pass)


@contextlib.contextmanager
def precision_policy(precision: str):
    """Sets Keras' global dtype policy for the models built inside, then restores it."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def evaluate(model: keras.Model, dataset, steps: int | None, verbose: int = 0) -> dict:
    """Top-1 and top-5 of `model` on `dataset`."""
    results = model.evaluate(dataset, steps=steps, verbose=verbose, return_dict=True)
    return {"top1": float(results["top1"]), "top5": float(results["top5"]),
            "loss": float(results["loss"])}


def flip_averaged(model: keras.Model) -> keras.Model:
    """`model` with flip test-time augmentation: the log of the mean of the probabilities of
    each image and of its horizontal mirror, as logits (softmax of them gives that mean)."""
    inputs = keras.Input(model.input_shape[1:], dtype=model.inputs[0].dtype)
    log_probabilities = [keras.ops.log_softmax(model(x), axis=-1)
                         for x in (inputs, keras.ops.flip(inputs, axis=2))]
    outputs = keras.ops.logaddexp(*log_probabilities) - math.log(2.0)
    return keras.Model(inputs, outputs, name=f"{model.name}_flip_averaged")


@contextlib.contextmanager
def reporting_data_errors(skip_counter):
    """Re-raises a dataset's NoReadableImagesError or DamagedDataError as itself, not
    wrapped by TensorFlow."""
    try:
        yield
    except Exception:
        if skip_counter is not None and skip_counter.error is not None:
            raise skip_counter.error from None
        raise


__all__ = ["build_datasets", "build_model", "build_optimizer", "class_names", "compile_model",
           "dataset_facts", "evaluate", "evaluation_steps", "flip_averaged", "images_scored",
           "input_options", "lr_schedule", "precision_policy", "reporting_data_errors",
           "resolutions", "save_outputs", "split_info", "use_one_hot"]
