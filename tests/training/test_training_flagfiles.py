"""Every flagfile in flags/ is what flags/generate.py writes, parses into a valid TrainConfig and
documents itself."""

import importlib.util
from pathlib import Path

import pytest
from absl import flags

from keras_efficientnet.cli.flags import config_from_flags, define_flags
from keras_efficientnet.models.efficientnet import SCALING
from keras_efficientnet.models.presets import GRAPHCORE_TOP1, PAPER_TOP1, preset_config

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
        assert f"{variant}-g1-gn-baseline.flags" in names
    assert {"default.flags", "smoke.flags", "b4-g16-gn-lars.flags",
            "b4-g16-gn-lars-finetuned-ours.flags"} <= names


@pytest.mark.parametrize("path", FLAGFILES, ids=lambda p: p.name)
def test_flagfile_parses_and_opens_with_a_comment(path):
    assert path.read_text().startswith("# ")
    config = _parse(path)
    if config.mode == "train_and_finetune":
        # The paper picks train_res with the same residue mod 32 as test_res.
        assert config.train_resolution % 32 == config.test_resolution % 32


def _generate_module():
    spec = importlib.util.spec_from_file_location("generate", FLAGS_DIR / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    return generate


def test_generate_py_refuses_a_reduced_recipe_that_breaks_the_mod_32_rule(tmp_path, monkeypatch):
    generate = _generate_module()
    recipe = generate.FASHION_RECIPES["96-g16-lnpn-reduced"]
    # 32 -> 40 px: the last feature map is 1x1 in training and 2x2 at test (32 % 32 != 40 % 32).
    monkeypatch.setitem(generate.FASHION_RECIPES, "broken", (*recipe[:2], 32, 40, *recipe[4:]))
    with pytest.raises(SystemExit, match=r"refusing to write fashion-mnist-broken\.flags: "
                       r"--train_resolution=32 and --test_resolution=40 differ modulo 32"):
        generate.main(["--output_dir", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []  # nothing written, the good files neither
    # 64 -> 96 keeps it (0 == 0) and is written.
    monkeypatch.setitem(generate.FASHION_RECIPES, "broken", (*recipe[:2], 64, 96, *recipe[4:]))
    generate.main(["--output_dir", str(tmp_path)])
    assert (tmp_path / "fashion-mnist-broken.flags").exists()


def test_the_command_line_warns_in_one_line_for_a_recipe_that_breaks_the_rule(tmp_path, capsys):
    path = tmp_path / "broken.flags"
    path.write_text((FLAGS_DIR / "fashion-mnist-96-g16-lnpn-reduced.flags").read_text()
                    .replace("--train_resolution=64", "--train_resolution=80"))
    config = _parse(path)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["warning: --train_resolution=80 and --test_resolution=96 differ modulo 32 "
                     "(16 vs 0): the last feature map and padding change between training and "
                     "the fine-tune; pick train = test (mod 32); e.g. --train_resolution=64"]
    assert config.train_resolution == 80  # a warning, not a refusal
    _parse(FLAGS_DIR / "fashion-mnist-96-g16-lnpn-reduced.flags")
    assert capsys.readouterr().err == ""


def test_generate_py_rewrites_every_committed_flagfile_byte_for_byte(tmp_path):
    generate = _generate_module()
    generate.main(["--output_dir", str(tmp_path)])
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [p.name for p in FLAGFILES]  # no committed flagfile it does not write
    for name in written:
        assert (tmp_path / name).read_bytes() == (FLAGS_DIR / name).read_bytes(), name


def test_recipe_numbers_of_two_presets():
    b0 = _parse(FLAGS_DIR / "b0-g16-lnpn-half.flags")
    assert (b0.train_resolution, b0.test_resolution) == (160, 224)
    assert b0.global_batch_size == 768
    assert b0.peak_learning_rate() == pytest.approx(0.046875)
    assert preset_config(b0.model)["expand_ratio"] == 4
    assert b0.decay_epochs * 146 == pytest.approx(350)  # 146 drops counted from step 0
    assert (b0.mixup_alpha, b0.cutmix_lambda, b0.cutmix_version) == (0.1, 0.0, 1)
    assert b0.finetune_global_batch_size == 512 and b0.finetune_plan.micro_batches_per_update == 16
    assert b0.finetune_learning_rate_per_sample * 512 == 0.25
    assert b0.finetune_warmup_epochs == 5 and b0.finetune_epochs == 2
    lars = _parse(FLAGS_DIR / "b4-g16-gn-lars.flags")
    assert lars.global_batch_size == 6144
    assert lars.peak_learning_rate() == pytest.approx(8.485, abs=1e-3)
    assert lars.train_resolution == SCALING["b4"].resolution
    # Graphcore's "16.16" with stochastic rounding, in the fields the IPU plan reads.
    assert (lars.precision, lars.stochastic_rounding, lars.strategy) == ("float16", "on", "ipu")
    assert lars.plan.uses_stochastic_rounding and lars.plan.precision == "float16"
    # Graphcore's run: trained at 380 and validated, no fine-tune.
    assert lars.mode == "train"
    ours = _parse(FLAGS_DIR / "b4-g16-gn-lars-finetuned-ours.flags")
    assert ours.mode == "train_and_finetune" and ours.finetune_global_batch_size == 504
    assert ours.finetune_plan.micro_batches_per_update == 21
    flags_of = lambda name: [line for line in (FLAGS_DIR / name).read_text().splitlines()
                             if line.startswith("--") and not line.startswith("--mode=")]
    assert [line for line in flags_of("b4-g16-gn-lars-finetuned-ours.flags")
            if not line.startswith("--finetune_")] == flags_of("b4-g16-gn-lars.flags")


PAPER_ROWS = [p for p in FLAGFILES if p.name[:2] in ("b0", "b1", "b2", "b3", "b4", "b5")]


@pytest.mark.parametrize("path", PAPER_ROWS, ids=lambda p: p.name)
def test_every_row_but_the_baseline_fine_tunes_at_the_test_size(path):
    config = _parse(path)
    recipe = path.stem.split("-")[-1]
    trains_only = recipe == "baseline" or path.name == "b4-g16-gn-lars.flags"
    assert config.mode == ("train" if trains_only else "train_and_finetune")
    assert (config.train_resolution == config.test_resolution) == (recipe != "half")


# Hand-copied from the paper's Figure 1 as read in the developers' reference (not from
# PAPER_TOP1): one row of each series.
FIGURE_1 = {
    "b0-g1-gn-baseline": 76.2, "b5-g1-gn-baseline": 82.8, "b3-g1-gn-native": 82.1,
    "b2-g16-gn-native": 81.5, "b1-g16-gn-half": 80.0, "b4-g16-lnpn-native": 83.4,
    "b0-g16-lnpn-half": 78.3, "b5-g16-lnpn-half": 83.8,
}


def test_paper_top1_holds_the_figure_1_readings():
    assert len(PAPER_TOP1) == 6 * 6
    for stem, top1 in FIGURE_1.items():
        variant, rest = stem.split("-", 1)
        family, recipe = rest.rsplit("-", 1)
        assert PAPER_TOP1[(f"efficientnet-{variant}-{family}", recipe)] == top1, stem
    for variant in ("b0", "b1", "b2", "b3", "b4", "b5"):  # the fine-tune beats the baseline
        g1 = f"efficientnet-{variant}-g1-gn"
        assert PAPER_TOP1[(g1, "native")] > PAPER_TOP1[(g1, "baseline")]
    assert GRAPHCORE_TOP1 == {("efficientnet-b4-g16-gn", "lars"): 82.6}


@pytest.mark.parametrize("path", PAPER_ROWS, ids=lambda p: p.name)
def test_each_flagfile_names_the_accuracy_it_aims_at(path):
    text = path.read_text()
    config = _parse(path)
    key = (config.model, path.stem.split("-")[-1])
    if path.name.startswith("b4-g16-gn-lars"):
        assert "~82.6%" in text
        assert ("Ours, not Graphcore's" in text) == path.name.endswith("-ours.flags")
    elif key in PAPER_TOP1:
        assert (f"# Aims at {PAPER_TOP1[key]:.1f}% top-1 on ImageNet validation, read off the "
                "paper's Figure 1") in text
    else:
        assert key[0].endswith("-g1-gn") and key[1] == "half", path.name
        assert "# This recipe is ours" in text
