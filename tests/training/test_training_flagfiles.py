"""Every flagfile in flags/ parses into a valid TrainConfig and documents itself."""

from pathlib import Path

import pytest
from absl import flags

from keras_efficientnet.cli.flags import config_from_flags, define_flags
from keras_efficientnet.models.efficientnet import SCALING
from keras_efficientnet.models.presets import preset_config

pytestmark = pytest.mark.tf_only

FLAGS_DIR = Path(__file__).resolve().parents[2] / "flags"
FLAGFILES = sorted(FLAGS_DIR.glob("*.flags"))


def _parse(path):
    values = flags.FlagValues()
    define_flags(values)
    values(["prog", f"--flagfile={path}"])
    return config_from_flags(values)


def test_the_paper_presets_are_all_there():
    names = {p.name for p in FLAGFILES}
    for variant in ("b0", "b1", "b2", "b3", "b4", "b5"):
        for family in ("g1-gn", "g16-gn", "g16-lnpn"):
            for resolution in ("native", "half"):
                assert f"{variant}-{family}-{resolution}.flags" in names
    assert {"default.flags", "smoke.flags", "b4-g16-gn-lars.flags"} <= names


@pytest.mark.parametrize("path", FLAGFILES, ids=lambda p: p.name)
def test_flagfile_parses_and_opens_with_a_comment(path):
    assert path.read_text().startswith("# ")
    config = _parse(path)
    if config.mode == "train_and_finetune":
        # The paper picks train_res with the same residue mod 32 as test_res.
        assert config.train_resolution % 32 == config.test_resolution % 32


def test_recipe_numbers_of_two_presets():
    b0 = _parse(FLAGS_DIR / "b0-g16-lnpn-half.flags")
    assert (b0.train_resolution, b0.test_resolution) == (160, 224)
    assert b0.global_batch_size == 768
    assert b0.peak_learning_rate() == pytest.approx(0.046875)
    assert preset_config(b0.model)["expand_ratio"] == 4
    lars = _parse(FLAGS_DIR / "b4-g16-gn-lars.flags")
    assert lars.global_batch_size == 6144
    assert lars.peak_learning_rate() == pytest.approx(8.485, abs=1e-3)
    assert lars.train_resolution == SCALING["b4"].resolution
