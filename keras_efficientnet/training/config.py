"""The frozen training configuration: one field per command-line flag, validated in one place."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import warnings
from dataclasses import dataclass, field

from keras_efficientnet.datasets.options import EVAL_RESIZE_RATIO, HoldOut
from keras_efficientnet.datasets.source_table import parse_source
from keras_efficientnet.training.modes import MODE_TABLE, MODES, modes_help
from keras_efficientnet.training.plan import (
    PRECISIONS,
    STOCHASTIC_ROUNDING,
    STRATEGIES,
    ExecutionPlan,
    plan_from_values,
)

OPTIMIZERS = ("rmsprop", "lars", "sgd")
DECAYS = ("exponential", "cosine", "polynomial", "constant")
EVALUATE_WEIGHTS = ("final", "best", "average", "latest")


def _f(default, help: str, choices=None):
    """A config field carrying its flag help text (and enum choices) as metadata."""
    metadata = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TrainConfig:
    """Everything a run needs. The CLI builds it from flags; notebooks may build it directly."""

    # What to do and where.
    mode: str = _f("train_and_finetune", modes_help(), MODES)
    model_dir: str = _f("runs/default", "Checkpoints, TensorBoard logs and results.json; one "
                                        "run at a time (run.lock).")
    resume: bool = _f(True, "Resume from the latest good checkpoint in model_dir when there is "
                            "one. --noresume starts afresh and first moves an earlier run's "
                            "files to model_dir/previous/<time>/.")
    keep_checkpoints: int = _f(3, "Checkpoints to keep (the newest; the last good one is "
                                  "always kept too).")
    checkpoint_steps: int = _f(0, "Also checkpoint every N training step calls, mid-epoch; "
                                  "0 = at epoch ends only.")
    checkpoint_minutes: float = _f(0.0, "Also checkpoint when N minutes passed since the last "
                                        "save (long epochs); 0 = off.")
    export_dir: str = _f("", "Also write the final model here as a TensorFlow SavedModel "
                             "(serving signature: uint8 images in, probabilities out); empty = "
                             "none. Every training run writes model_dir/model.keras.")

    # Model.
    model: str = _f("efficientnet-b0-g16-lnpn",
                    "Architecture preset (see keras_efficientnet.models.PRESETS).")
    weights: str = _f("", "Start training from these weights: 'imagenet' (keras.applications' "
                          "ImageNet weights, G1-BN presets), a run's model.keras or "
                          ".weights.h5 (any preset, the same one), a keras.applications "
                          ".h5 file, a checkpoint folder or RUN[:final|best|average|latest]. "
                          "Another class count gets a new classifier. Empty = random.")
    dropout_rate: float = _f(-1.0, "Dropout before the classifier; -1 keeps the variant's.")
    drop_connect_rate: float = _f(0.2, "Stochastic depth of the last block.")

    # Data.
    dataset: str = _f("digits", "digits, fashion_mnist, synthetic, folder:PATH, tfds:NAME or "
                                "tfrecord:PATTERN.")
    data_dir: str = _f("", "Data directory (tfds data_dir, where digits are written, or the "
                           "folder of the Fashion-MNIST idx files).")
    train_split: str = _f("train", "Split to train (and fine-tune) on.")
    eval_split: str = _f("validation", "Held-out split to evaluate on (an image folder's "
                                       "validation/, val/ or valid/).")
    validation_split: float = _f(0.0, "An image folder without a held-out split (or a plain "
                                      "folder of class folders): hold out this share of each "
                                      "class of --train_split as --eval_split, the same images "
                                      "in every run (chosen by file name); recorded in "
                                      "config.json, so --mode=evaluate scores them too. 0 = "
                                      "none.")
    crop_area_min: float = _f(0.05, "Smallest area fraction of the random training crop.")
    random_flip: bool = _f(True, "Random horizontal flips in training.")
    allow_empty_classes: bool = _f(False, "Keep class folders without images as classes (with "
                                          "a warning); by default they are refused, named.")
    mixup_alpha: float = _f(0.0, "Mixup Beta(alpha, alpha), one draw per example; 0 disables.")
    cutmix_lambda: float = _f(0.0, "CutMix nominal lambda (kept area); 0 disables.")
    cutmix_version: int = _f(1, "CutMix 1: each batch's kept fraction drawn from --cutmix_lambda "
                                "(Graphcore's v1); 2: fixed at --cutmix_lambda.")
    eval_resize_ratio: float = _f(EVAL_RESIZE_RATIO,
                                  "Evaluation: resize short side to res x ratio.")
    eval_flip: bool = _f(False, "Evaluation also scores flip test-time augmentation (each "
                                "image as the mean probabilities of it and its mirror: two "
                                "forward passes), as flip_top1/flip_top5; top1 stays one pass. "
                                "Per-epoch validation and best.keras do not use it.")
    cache: bool = _f(False, "Cache the encoded dataset in memory.")
    shuffle_buffer: int = _f(10_000, "Shuffle buffer size (examples).")
    seed: int = _f(0, "Seed for initialisation, shuffling and augmentation.")
    deterministic: bool = _f(False, "Deterministic input order and ops (slower).")
    host_threads: int = _f(0, "Private tf.data thread pool size; 0 lets tf.data choose.")

    # Resolutions.
    train_resolution: int = _f(0, "Training resolution; 0 = the variant's native one.")
    test_resolution: int = _f(0, "Evaluation and fine-tune resolution; 0 = native.")

    # Batch and execution plan (`config.plan`; keras_efficientnet.distribute runs it).
    strategy: str = _f("default", "Distribution strategy: one device, mirrored (local GPUs, or "
                                  "logical CPUs when there is none), multiworker (TF_CONFIG), "
                                  "horovod (horovodrun) or ipu (see README: needs Graphcore's "
                                  "SDK, cannot run with Keras 3).", STRATEGIES)
    micro_batch_size: int = _f(32, "Examples per replica per forward pass (a micro-batch).")
    gradient_accumulation: int = _f(1, "Micro-batches per replica whose gradients make one "
                                       "optimizer update.")
    replicas: int = _f(1, "Data-parallel replicas (global batch = micro x accum x replicas).")
    pipeline_splits: str = _f("", "Blocks that start pipeline stages 1, 2, ... (e.g. block4a), "
                                  "or auto:N for the planner's N stages; empty = no pipeline.")
    peer_timeout: float = _f(60.0, "multiworker: seconds to wait for every peer in TF_CONFIG "
                                   "to answer, then again for TensorFlow to join them; the "
                                   "run fails naming the peer that did not.")
    device_iterations: int = _f(1, "Optimizer updates per host call (the step calls per host "
                                   "call, Keras' steps_per_execution, are this x the step "
                                   "calls per update).")
    precision: str = _f("float32", "Compute precision (float16: weights too, Graphcore's "
                                   "16.16; mixed_float16: their 16.32).", PRECISIONS)
    stochastic_rounding: str = _f("auto", "IPU: stochastic rounding of 16-bit arithmetic; "
                                          "auto = on for 16-bit precisions (ignored by the "
                                          "other strategies).", tuple(STOCHASTIC_ROUNDING))

    # Optimisation.
    optimizer: str = _f("rmsprop", "Optimizer.", OPTIMIZERS)
    learning_rate: float = _f(0.0, "Peak learning rate; 0 = learning_rate_per_sample x batch.")
    learning_rate_per_sample: float = _f(2.0 ** -14,
                                         "Peak rate per example of the global batch.")
    momentum: float = _f(0.9, "Momentum (RMSProp, LARS, SGD).")
    rmsprop_rho: float = _f(0.953125, "RMSProp decay of the mean square.")
    rmsprop_epsilon: float = _f(1e-3, "RMSProp epsilon, inside the square root.")
    lars_eta: float = _f(0.001, "LARS trust coefficient.")
    lars_epsilon: float = _f(0.0, "LARS epsilon.")
    weight_decay: float = _f(1e-5, "L2 weight decay (inside LARS; on the gradient otherwise).")
    label_smoothing: float = _f(0.1, "Label smoothing of the cross-entropy.")
    lr_schedule: str = _f("exponential", "Decay after warm-up.", DECAYS)
    warmup_epochs: float = _f(5.0, "Linear warm-up length in epochs.")
    decay_epochs: float = _f(2.4, "Exponential: epochs per staircase step, counted from step "
                                  "0 (Graphcore: 350 / 146).")
    decay_rate: float = _f(0.97, "Exponential: factor per staircase step.")
    poly_power: float = _f(2.0, "Polynomial decay power.")
    end_learning_rate_ratio: float = _f(1e-5, "Cosine/polynomial: end rate / peak rate.")
    ema_decay: float = _f(0.0, "Per-step exponential moving average of weights; 0 disables.")
    weight_average_decay: float = _f(
        0.97, "Exponential average of per-epoch weights, evaluated and fine-tuned; 0 disables.")
    divergence_factor: float = _f(
        10.0, "Stop training when the loss stays above this x ln(classes) for "
              "--divergence_steps step ends (a finite divergence); 0 = off.")
    divergence_steps: int = _f(5, "Consecutive step ends above --divergence_factor that stop "
                                  "the run.")

    # Length.
    epochs: int = _f(10, "Training epochs.")
    updates_per_epoch: int = _f(0, "Optimizer updates per epoch (each of --global_batch_size "
                                   "examples); 0 = one pass over the training split (its "
                                   "examples // the global batch).")
    steps_per_epoch: int = _f(0, "Deprecated: the old name of --updates_per_epoch (the same "
                                 "unit, optimizer updates); removed in the next release.")
    eval_steps: int = _f(0, "Evaluation batches; 0 = the whole split.")
    eval_every: int = _f(1, "Validate on --eval_split every N training epochs with the weights "
                            "the run would ship (weight average or EMA where the recipe uses "
                            "one): val top-1/top-5/loss in the epoch line, TensorBoard, "
                            "metrics.csv and results.json; 0 = only at the end.")
    finetune_epochs: int = _f(2, "Fine-tune epochs at the test resolution.")
    finetune_batch_size: int = _f(0, "Examples per fine-tune update; 0 = the training global "
                                     "batch. Micro-batch and replicas stay: a multiple of "
                                     "both.")
    finetune_learning_rate: float = _f(0.0, "Fine-tune nominal peak rate; 0 = "
                                            "finetune_learning_rate_per_sample x its batch.")
    finetune_learning_rate_per_sample: float = _f(
        2.0 ** -11, "Fine-tune rate per example (Graphcore: 2^-11, i.e. 0.25 at batch 512).")
    finetune_warmup_epochs: float = _f(
        5.0, "Fine-tune linear warm-up in epochs, over a cosine counted from step 0 (Graphcore's "
             "5 outlast its 2 epochs: the rate rises, then falls to 0).")
    init_checkpoint: str = _f("", "Weights to fine-tune or evaluate: a .keras, .weights.h5 or "
                                  "keras.applications .h5 file, a checkpoint folder, or "
                                  "RUN[:final|best|average|latest] (a run alone: its latest "
                                  "checkpoint's weight average); empty = model_dir's.")
    evaluate_weights: str = _f(
        "final", "--mode=evaluate --model_dir=RUN scores: final = RUN/model.keras (what the "
                 "run shipped; the checkpoints when the run wrote none), best = "
                 "RUN/best.keras (the best validation top-1), average = the latest "
                 "checkpoint's weight average, latest = its raw weights. The run's "
                 "config.json supplies the model, data and resolution flags.",
        EVALUATE_WEIGHTS)
    verbose: int = _f(1, "0 silent, 1 progress bar, 2 one line per epoch.")

    @functools.cached_property
    def plan(self) -> ExecutionPlan:
        """The execution plan of these fields: batch sizes and step counts derive from it."""
        return plan_from_values(self.to_dict())

    @property
    def hold_out(self) -> HoldOut | None:
        """The image folder hold-out of --validation_split (None when 0)."""
        return HoldOut(self.validation_split, self.train_split) if self.validation_split else None

    @property
    def global_batch_size(self) -> int:
        return self.plan.global_batch_size

    @property
    def finetune_global_batch_size(self) -> int:
        return self.finetune_batch_size or self.global_batch_size

    @property
    def finetune_plan(self) -> ExecutionPlan:
        """The fine-tune's plan: updates of `finetune_global_batch_size` examples, with the
        training plan's micro-batch, replicas, strategy and stages."""
        return self.plan.with_examples_per_update(self.finetune_global_batch_size,
                                                  "--finetune_batch_size")

    def peak_learning_rate(self) -> float:
        if self.learning_rate > 0:
            return self.learning_rate
        return self.learning_rate_per_sample * self.global_batch_size

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}; valid fields: {sorted(known)}")
        return cls(**values)

    def __post_init__(self):
        _take_deprecated_names(self)
        validate(self)


# Old flag name -> new one (the same unit), accepted for one release with a warning.
DEPRECATED_FIELDS = {"steps_per_epoch": "updates_per_epoch"}


def _take_deprecated_names(config: TrainConfig) -> None:
    """Moves a value given under an old name to its new field (a frozen dataclass: here, once),
    with a FutureWarning naming both; refuses the two names disagreeing."""
    for old, new in DEPRECATED_FIELDS.items():
        value = getattr(config, old)
        if not value:
            continue
        if getattr(config, new) not in (0, value):
            raise ValueError(f"--{old}={value} and --{new}={getattr(config, new)} disagree; "
                             f"give only --{new} (--{old} is its deprecated name)")
        warnings.warn(f"--{old} is deprecated and will be removed in the next release; use "
                      f"--{new}={value} (the same unit)", FutureWarning, stacklevel=4)
        object.__setattr__(config, new, value)
        object.__setattr__(config, old, 0)


# Fields that define the architecture: a resume or fine-tune must agree on them.
ARCHITECTURE_FIELDS = ("model", "dropout_rate", "drop_connect_rate")


# Numeric fields and the range each must lie in (the message names the flag and the value).
POSITIVE_FIELDS = ("micro_batch_size", "gradient_accumulation", "replicas", "device_iterations",
                   "keep_checkpoints", "divergence_steps")
NON_NEGATIVE_FIELDS = (
    "epochs", "finetune_epochs", "updates_per_epoch", "eval_steps", "eval_every",
    "train_resolution", "test_resolution", "warmup_epochs", "weight_decay", "learning_rate",
    "finetune_learning_rate", "mixup_alpha", "host_threads", "finetune_batch_size",
    "finetune_warmup_epochs", "checkpoint_steps", "checkpoint_minutes", "divergence_factor")
UNIT_INTERVAL_FIELDS = ("label_smoothing", "ema_decay", "weight_average_decay", "cutmix_lambda")


def validate(config: TrainConfig) -> None:
    """Raises a ValueError naming the flag, its value and what would be valid."""
    _check_fields(config)
    _check_model(config.model)
    _check_dataset(config.dataset)
    _check_ranges(config)
    from keras_efficientnet.runs import weights
    from keras_efficientnet.training.warm_start import check_weights_flag

    check_weights_flag(config.weights, config.model)
    weights.check(config.init_checkpoint, "--init_checkpoint")
    _check_run(config)
    # The plan's own rules (strategy, replicas and stages together) and its split names.
    config.plan.check_block_names(preset_block_names(config.model), config.model)


def _check_fields(config: TrainConfig) -> None:
    """Every float finite, every enum one of its choices."""
    for f in dataclasses.fields(config):
        choices = f.metadata.get("choices")
        value = getattr(config, f.name)
        if f.type in (float, "float") and not math.isfinite(value):  # NaN passes `< 0`
            raise ValueError(f"--{f.name} must be a finite number, received {value}")
        if choices and value not in choices:
            raise ValueError(f"--{f.name}={value!r} is not valid; choose one of {list(choices)}")


def _check_model(model: str) -> None:
    from keras_efficientnet.models.presets import PRESETS

    if model not in PRESETS:
        close = difflib.get_close_matches(model, PRESETS, n=3)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(f"--model={model!r} is not a known preset; {hint}valid: "
                         f"{sorted(PRESETS)}")


def _check_dataset(dataset: str) -> None:
    try:  # the plain-Python source table: before TensorFlow loads and the run directory moves
        parse_source(dataset)
    except ValueError as error:
        raise ValueError(f"--dataset={dataset!r}: {error}") from None


def _check_ranges(config: TrainConfig) -> None:
    for name in POSITIVE_FIELDS:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name} must be >= 1, received {getattr(config, name)}")
    for name in NON_NEGATIVE_FIELDS:
        if getattr(config, name) < 0:
            raise ValueError(f"--{name} must be >= 0, received {getattr(config, name)}")
    for name in UNIT_INTERVAL_FIELDS:
        if not 0.0 <= getattr(config, name) < 1.0:
            raise ValueError(f"--{name} must be in [0, 1), received {getattr(config, name)}")
    if not 0.0 <= config.validation_split < 1.0:
        raise ValueError(f"--validation_split must be in [0, 1) (0 = no hold-out), received "
                         f"{config.validation_split}")
    if not config.peer_timeout > 0:  # also refuses NaN
        raise ValueError(f"--peer_timeout must be > 0 seconds, received {config.peer_timeout}")
    if not 0.0 < config.crop_area_min <= 1.0:
        raise ValueError(f"--crop_area_min must be in (0, 1], received {config.crop_area_min}")
    for name in ("train_resolution", "test_resolution"):
        value = getattr(config, name)
        if 0 < value < 32:
            raise ValueError(f"--{name} must be 0 (native) or >= 32, received {value}")
    if not config.finetune_learning_rate_per_sample > 0:
        raise ValueError("--finetune_learning_rate_per_sample must be > 0, received "
                         f"{config.finetune_learning_rate_per_sample}")
    if config.cutmix_version not in (1, 2):
        raise ValueError(f"--cutmix_version must be 1 or 2, received {config.cutmix_version}")


def _check_run(config: TrainConfig) -> None:
    """The directories, the mode's needs and the fine-tune's batch."""
    if not config.model_dir:
        raise ValueError("--model_dir must not be empty")
    if config.export_dir and os.path.isfile(config.export_dir):
        raise ValueError(f"--export_dir={config.export_dir!r} is a file; give a directory "
                         "(created if missing)")
    mode = MODE_TABLE[config.mode]
    if mode.trains and config.epochs < 1:
        raise ValueError(f"--mode={config.mode} needs --epochs >= 1, received {config.epochs}")
    if mode.finetunes and config.finetune_epochs > 0:
        _ = config.finetune_plan  # raises naming --finetune_batch_size


class ResolutionRuleWarning(UserWarning):
    """A `train_and_finetune` run whose train and test resolutions differ modulo 32."""


def native_resolution(model: str) -> int:
    """The preset's own resolution (what --train_resolution=0 and --test_resolution=0 mean)."""
    from keras_efficientnet.models.architecture import SCALING
    from keras_efficientnet.models.presets import preset_config

    return SCALING[preset_config(model)["variant"]].resolution


def resolved_resolutions(config: TrainConfig) -> tuple[int, int]:
    """(train, test) resolutions, 0 meaning the preset's native resolution."""
    native = native_resolution(config.model)
    return config.train_resolution or native, config.test_resolution or native


def resolution_rule_problem(config: TrainConfig) -> str | None:
    """One line saying how a reduced-resolution recipe breaks train_res = test_res (mod 32), or
    None when it keeps the rule (or trains and tests at one resolution).

    A stride-32 network's last feature map and its padding pattern only match between the two
    resolutions when they agree modulo 32 (docs/recipes.md): at 32 -> 40 px the tiny model's
    last map is 1x1 in training and 2x2 at test, and the head fine-tune measures that mismatch
    before it measures the method."""
    mode = MODE_TABLE[config.mode]
    if not (mode.trains and mode.finetunes):  # one phase at one resolution
        return None
    train, test = resolved_resolutions(config)
    if train % 32 == test % 32:
        return None
    # The paper's reduced resolutions keep about half the pixels (B0: 160 for 224).
    candidates = [r for r in range(test - 32, 31, -32) if r * r <= 0.6 * test * test]
    hint = f"; e.g. --train_resolution={candidates[0]}" if candidates else ""
    return (f"--train_resolution={train} and --test_resolution={test} differ modulo 32 "
            f"({train % 32} vs {test % 32}): the last feature map and padding change between "
            f"training and the fine-tune; pick train = test (mod 32){hint}")


def preset_block_names(model: str) -> list[str]:
    """Block names of a preset (split points), without building the model."""
    from keras_efficientnet.models.architecture import SCALING, block_specs
    from keras_efficientnet.models.presets import preset_config

    scaling = SCALING[preset_config(model)["variant"]]
    return [spec.name for spec in block_specs(scaling.width, scaling.depth)]
