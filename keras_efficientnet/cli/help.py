"""`train --help`: the project's flags by group, with their defaults (absl's own: --helpfull)."""

from __future__ import annotations

import textwrap

from absl import flags

from keras_efficientnet.cli.errors import exit_status_help

# Group titles in the order `--help` prints them, and the flags of each. A flag in none of
# them prints under "other" (a new config field that this table has not caught up with).
GROUPS = {
    "recipe": ("recipe", "show", "flagfile"),
    "model": ("model", "weights", "classes", "dropout_rate", "drop_connect_rate"),
    "data": ("dataset", "data_dir", "train_split", "eval_split", "validation_split",
             "train_resolution",
             "test_resolution", "crop_area_min", "random_flip", "mixup_alpha", "cutmix_lambda",
             "cutmix_version", "eval_resize_ratio", "eval_flip", "allow_empty_classes", "cache",
             "shuffle_buffer", "host_threads"),
    "optimization": ("optimizer", "learning_rate", "learning_rate_per_sample", "momentum",
                     "rmsprop_rho", "rmsprop_epsilon", "lars_eta", "lars_epsilon",
                     "weight_decay", "label_smoothing", "ema_decay", "weight_average_decay",
                     "precision", "stochastic_rounding", "divergence_factor",
                     "divergence_steps"),
    "schedule": ("mode", "epochs", "updates_per_epoch", "steps_per_epoch", "eval_steps",
                 "eval_every",
                 "lr_schedule", "warmup_epochs", "decay_epochs", "decay_rate", "poly_power",
                 "end_learning_rate_ratio", "finetune_epochs", "finetune_batch_size",
                 "finetune_learning_rate", "finetune_learning_rate_per_sample",
                 "finetune_warmup_epochs"),
    "run directory": ("model_dir", "resume", "init_checkpoint", "evaluate_weights",
                      "keep_checkpoints",
                      "checkpoint_steps", "checkpoint_minutes", "seed", "deterministic",
                      "verbose"),
    "execution plan": ("strategy", "micro_batch_size", "gradient_accumulation",
                       "global_batch_size", "replicas", "pipeline_splits", "device_iterations",
                       "peer_timeout"),
    "export": ("export_dir",),
}
OTHER = "other"
USAGE = ("usage: keras-efficientnet-train [--recipe=NAME | --flagfile=FILE] [--flag=value ...]\n"
         "(or python -m keras_efficientnet.train). Flags given beside a recipe override it;\n"
         "without one the default recipe runs (`make train`); --recipe=list lists them all.")


def project_flags(names, flag_values: flags.FlagValues) -> dict[str, list[str]]:
    """The flag names by group (GROUPS' order, then OTHER), keeping only defined ones."""
    names = list(names)
    grouped = {title: [n for n in members if n in flag_values and n in names]
               for title, members in GROUPS.items()}
    known = {n for members in GROUPS.values() for n in members}
    grouped[OTHER] = [n for n in names if n not in known and n in flag_values]
    return {title: members for title, members in grouped.items() if members}


def _describe(flag: flags.Flag) -> str:
    default = repr(flag.default) if isinstance(flag.default, str) else flag.default
    line = f"--{flag.name}  (default: {default})"
    text = " ".join((flag.help or "").split())
    return line + "\n" + textwrap.fill(text, 96, initial_indent="      ",
                                       subsequent_indent="      ")


def grouped_help(names, flag_values: flags.FlagValues = flags.FLAGS) -> str:
    """The `--help` text for the flags `names`."""
    parts = [USAGE, ""]
    for title, members in project_flags(names, flag_values).items():
        parts.append(f"{title}:")
        parts += ["  " + _describe(flag_values[name]) for name in members]
        parts.append("")
    parts.append("--verbosity=0 shows TensorFlow's and absl's start-up logs (quiet by "
                 "default); --helpfull lists absl's own flags too.")
    parts.append(exit_status_help())
    return "\n".join(parts)
