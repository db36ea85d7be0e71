"""benchmarks/bench_fashion_protocol.py: the reading of its rows (time to a target accuracy,
intervals, images seen), its run keys, and that each experiment names committed recipes that
keep the mod-32 rule. Its commands run in the benchmark smoke test."""

import json

import pytest

from benchmarks import bench_fashion_protocol as protocol

pytestmark = pytest.mark.tf_only


def _row(recipe, seed, curve, top1, experiment="table96"):
    return {"experiment": experiment, "recipe": recipe, "seed": seed, "top1": top1,
            "flip_top1": top1 + 0.003, "train_seconds": curve[-1][1],
            "images_per_second": 100.0 + seed, "quiet": True,
            "curve": [{"epoch": i + 1, "val_top1": v, "train_seconds": s}
                      for i, (v, s) in enumerate(curve)]}


def test_first_reach_is_the_training_seconds_of_the_first_epoch_at_the_target():
    curve = [{"val_top1": None, "train_seconds": 5.0}, {"val_top1": 0.80, "train_seconds": 10.0},
             {"val_top1": 0.91, "train_seconds": 20.0}, {"val_top1": 0.95, "train_seconds": 30.0}]
    assert protocol.first_reach(curve, 0.90) == 20.0
    assert protocol.first_reach(curve, 0.80) == 10.0
    assert protocol.first_reach(curve, 0.96) is None


def test_summary_targets_the_reference_mean_final_validation():
    reference = "96-g1-bn-native"
    rows = [_row(reference, 0, [(0.80, 100.0), (0.90, 200.0)], 0.89),
            _row(reference, 1, [(0.82, 110.0), (0.92, 220.0)], 0.91),
            _row("96-g16-lnpn-reduced", 0, [(0.91, 50.0), (0.93, 100.0)], 0.92),
            _row("96-g16-lnpn-reduced", 1, [(0.85, 60.0), (0.89, 120.0)], 0.88)]
    summary = protocol.summarize(rows, "table96")
    assert summary[reference]["target"] == pytest.approx(0.91)  # (0.90 + 0.92) / 2
    # Reference seeds: seed 0 ends at 0.90 < 0.91 (never), seed 1 reaches at 220 s.
    assert summary[reference]["reached"] == 1
    assert summary[reference]["seconds_to_target"]["mean"] == 220.0
    reduced = summary["96-g16-lnpn-reduced"]
    assert reduced["reached"] == 1 and reduced["seconds_to_target"]["mean"] == 50.0
    # Two seeds: mean 0.90, half-width t(0.975, 1) * stdev / sqrt(2) = 12.706 * 0.02828 / 1.414.
    assert reduced["top1"]["mean"] == pytest.approx(0.90)
    assert reduced["top1"]["half_width"] == pytest.approx(12.7062 * 0.0282843 / 2 ** 0.5,
                                                          rel=1e-4)
    assert reduced["label"] == "G16-LN+PN 64 -> 96 + head"


def test_train_images_counts_whole_batches_of_one_pass_unless_updates_are_given():
    trained = {"global_batch_size": 64, "train_examples": 55000,
               "config": {"epochs": 12, "updates_per_epoch": 0}}
    assert protocol.train_images(trained) == 12 * (55000 // 64) * 64
    trained["config"]["updates_per_epoch"] = 20
    assert protocol.train_images(trained) == 12 * 20 * 64


def test_the_run_key_changes_with_the_recipe_text_not_its_seed_flag(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "FLAGS_DIR", tmp_path)
    recipe = tmp_path / "fashion-mnist-x.flags"
    recipe.write_text("# comment\n--epochs=12\n--seed=0\n--model_dir=runs/x\n")
    key = protocol.run_key("x", 0, {})
    recipe.write_text("# another comment\n--epochs=12\n--seed=5\n--model_dir=runs/y\n")
    assert protocol.run_key("x", 0, {}) == key
    assert protocol.run_key("x", 1, {}) != key
    assert protocol.run_key("x", 0, {"epochs": 2}) != key
    recipe.write_text("--epochs=13\n")
    assert json.loads(protocol.run_key("x", 0, {}))["digest"] != json.loads(key)["digest"]


@pytest.mark.parametrize("experiment", list(protocol.EXPERIMENTS))
def test_every_recipe_is_a_committed_flagfile_that_keeps_the_mod_32_rule(experiment):
    for recipe in protocol.EXPERIMENTS[experiment]:
        text = protocol.flagfile(recipe).read_text()
        values = dict(line[2:].split("=", 1) for line in text.splitlines()
                      if line.startswith("--") and "=" in line)
        assert int(values["train_resolution"]) % 32 == int(values["test_resolution"]) % 32
    assert protocol.REFERENCE[experiment] in protocol.EXPERIMENTS[experiment]
