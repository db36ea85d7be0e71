"""Defines one absl flag per TrainConfig field and builds the frozen config from them."""

from __future__ import annotations

import dataclasses
import sys
import warnings

from absl import flags

from keras_efficientnet.training.config import (
    ResolutionRuleWarning,
    TrainConfig,
    resolution_rule_problem,
)
from keras_efficientnet.training.plan import accumulation_for

# Not a config field: it derives --gradient_accumulation (the config keeps the explicit factors).
GLOBAL_BATCH_HELP = ("Examples per optimizer update; > 0 derives --gradient_accumulation = "
                     "global / (micro_batch_size x replicas). 0 = micro x accumulation x "
                     "replicas.")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines `--<field>` for every TrainConfig field, with its default and help text, and
    `--global_batch_size`."""
    for f in dataclasses.fields(TrainConfig):
        if f.name in flag_values:
            continue
        help_text = f.metadata.get("help", f.name)
        choices = f.metadata.get("choices")
        if choices:
            flags.DEFINE_enum(f.name, f.default, list(choices), help_text,
                              flag_values=flag_values)
        elif f.type in (bool, "bool"):
            flags.DEFINE_bool(f.name, f.default, help_text, flag_values=flag_values)
        elif f.type in (int, "int"):
            flags.DEFINE_integer(f.name, f.default, help_text, flag_values=flag_values)
        elif f.type in (float, "float"):
            flags.DEFINE_float(f.name, f.default, help_text, flag_values=flag_values)
        else:
            flags.DEFINE_string(f.name, f.default, help_text, flag_values=flag_values)
    if "global_batch_size" not in flag_values:
        flags.DEFINE_integer("global_batch_size", 0, GLOBAL_BATCH_HELP, lower_bound=0,
                             flag_values=flag_values)


def config_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> TrainConfig:
    """The frozen config of the parsed flags (validated: bad values raise ValueError). A flag
    under its deprecated name prints one `warning:` line naming the new one."""
    values = {f.name: flag_values[f.name].value for f in dataclasses.fields(TrainConfig)}
    global_batch = flag_values["global_batch_size"].value if (
        "global_batch_size" in flag_values) else 0
    if global_batch:
        given = flag_values["gradient_accumulation"]
        values["gradient_accumulation"] = accumulation_for(
            global_batch, values["micro_batch_size"], values["replicas"],
            given.value if given.present else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FutureWarning)
        config = TrainConfig(**values)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr, flush=True)
    problem = resolution_rule_problem(config)
    if problem:  # said once, here, before any framework loads; the trainer's repeat is muted
        print(f"warning: {problem}", file=sys.stderr, flush=True)
        warnings.filterwarnings("ignore", category=ResolutionRuleWarning)
    return config
