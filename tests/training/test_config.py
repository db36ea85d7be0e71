"""training.config: the renamed --steps_per_epoch (now --updates_per_epoch) keeps working one
release, with one warning line, and the fine-tune's batch comes from the plan."""

from __future__ import annotations

import pytest
from absl import flags

from keras_efficientnet.cli.flags import config_from_flags, define_flags
from keras_efficientnet.training.config import TrainConfig


def test_steps_per_epoch_is_the_deprecated_name_of_updates_per_epoch():
    with pytest.warns(FutureWarning, match=r"--steps_per_epoch is deprecated .* use "
                                           r"--updates_per_epoch=7 \(the same unit\)"):
        config = TrainConfig(steps_per_epoch=7)
    assert (config.updates_per_epoch, config.steps_per_epoch) == (7, 0)
    assert config.plan.updates_per_epoch(10_000, config.updates_per_epoch) == 7
    assert TrainConfig.from_dict(config.to_dict()).updates_per_epoch == 7
    with pytest.raises(ValueError, match=r"--steps_per_epoch=7 and --updates_per_epoch=5 "
                                         r"disagree; give only --updates_per_epoch"):
        TrainConfig(steps_per_epoch=7, updates_per_epoch=5)


@pytest.mark.parametrize("flag", ["--steps_per_epoch=6", "--updates_per_epoch=6"])
def test_both_flag_names_set_the_updates_per_epoch(flag, capsys):
    values = flags.FlagValues()
    define_flags(values)
    values(["train", flag])
    assert config_from_flags(values).updates_per_epoch == 6
    err = capsys.readouterr().err
    deprecated = flag.startswith("--steps_per_epoch")
    assert (err == "warning: --steps_per_epoch is deprecated and will be removed in the next "
                   "release; use --updates_per_epoch=6 (the same unit)\n") if deprecated else (
        err == "")


def test_the_fine_tune_batch_is_the_plans_arithmetic():
    config = TrainConfig(strategy="mirrored", replicas=2, micro_batch_size=8,
                         gradient_accumulation=3, finetune_batch_size=80)
    assert config.finetune_plan.micro_batches_per_update == 5  # 80 / (8 per micro-batch x 2)
    assert config.finetune_plan.examples_per_update == 80 == 8 * 5 * 2
