"""Defines one absl flag per TrainConfig field and builds the frozen config from them."""

from __future__ import annotations

import dataclasses

from absl import flags

from keras_efficientnet.training.config import TrainConfig


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines `--<field>` for every TrainConfig field, with its default and help text."""
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


def config_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> TrainConfig:
    """The frozen config of the parsed flags (validated: bad values raise ValueError)."""
    return TrainConfig(**{f.name: flag_values[f.name].value
                          for f in dataclasses.fields(TrainConfig)})
