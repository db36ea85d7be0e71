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


def test_the_seeds_table_lists_every_run_in_recipe_order_against_the_reference_seed():
    reference = "96-g1-bn-native"
    rows = [_row("96-g16-gn-reduced", 1, [(0.85, 60.0)], 0.8910),
            _row(reference, 1, [(0.93, 110.0)], 0.9310),
            _row("96-g16-gn-reduced", 0, [(0.86, 60.0)], 0.8936),
            _row("96-g16-gn-reduced", 2, [(0.86, 60.0)], 0.8955),
            _row(reference, 0, [(0.93, 100.0)], 0.9332)]
    for row in rows:
        row.update(variant=protocol.EXPERIMENTS["table96"][row["recipe"]], val_top1=0.9,
                   load_average_mean=5.24, onednn="on" if row["seed"] else None,
                   machine={"cpu": "Intel(R) Xeon(R) Processor" if row["seed"] else None},
                   val_top1_before_finetune=None if row["recipe"] == reference else 0.7)
    lines = protocol.seeds_table(rows, "table96").splitlines()
    assert len(lines) == 2 + 5
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [(c[0], c[1]) for c in cells] == [
        ("G1-BN native 96", "0"), ("G1-BN native 96", "1"), ("G16-GN 64 -> 96 + head", "0"),
        ("G16-GN 64 -> 96 + head", "1"), ("G16-GN 64 -> 96 + head", "2")]
    # Minus the reference run of the same seed, by hand: 0.8936 - 0.9332, 0.8910 - 0.9310;
    # seed 2 has no reference run and the reference has no difference.
    assert [c[4] for c in cells] == ["-", "-", "-0.0396", "-0.0400", "-"]
    assert cells[0][2:4] == ["0.9332", "0.9362"] and cells[0][6] == "-"
    assert cells[2][6] == "0.7000"
    assert cells[2][7:] == ["100", "5.2", "not recorded", "not recorded"]
    assert cells[3][7:] == ["101", "5.2", "on", "Intel Xeon"]
    # Without a fine-tuned run the before-the-fine-tune column goes.
    for row in rows:
        row["val_top1_before_finetune"] = None
    untuned = protocol.seeds_table(rows, "table96").splitlines()
    assert "before the head fine-tune" not in untuned[0] and untuned[3].count("|") == 11


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


def test_finetune_cost_counts_the_fine_tune_epochs_images_at_its_rate():
    trained = {"global_batch_size": 64, "finetune_global_batch_size": 32,
               "train_examples": 55000, "finetune_images_per_second": 250.0,
               "config": {"mode": "train_and_finetune", "finetune_epochs": 2,
                          "updates_per_epoch": 0}}
    images, seconds = protocol.finetune_cost(trained)
    assert images == 2 * (55000 // 32) * 32 == 109952
    assert seconds == pytest.approx(109952 / 250.0)
    trained["config"]["mode"] = "train"
    assert protocol.finetune_cost(trained) == (0, None)


def _finetuned(row, finetune_seconds, after, finetune_images=6400):
    return {**row, "finetune_images": finetune_images, "finetune_seconds": finetune_seconds,
            "val_top1": after, "epochs": len(row["curve"]),
            "train_images": 12800 * len(row["curve"])}


def test_a_fine_tuned_run_reaches_the_target_only_after_its_fine_tune():
    reference = "96-g1-bn-native"
    rows = [_row(reference, 0, [(0.80, 100.0), (0.90, 200.0)], 0.89),
            _finetuned(_row("96-g16-lnpn-reduced", 0, [(0.60, 40.0), (0.70, 80.0)], 0.9),
                       finetune_seconds=15.0, after=0.93)]
    line = protocol.timeline(rows[1])
    assert [p["train_seconds"] for p in line] == [40.0, 80.0, 95.0]
    assert [p["finetuned"] for p in line] == [False, False, True]
    summary = protocol.summarize(rows, "table96")
    reduced = summary["96-g16-lnpn-reduced"]
    assert reduced["seconds_to_target"]["mean"] == 95.0  # 80 s of training + 15 of fine-tune
    assert reduced["final_top1"]["mean"] == 0.93


def test_the_chart_averages_seeds_epoch_by_epoch_when_a_curve_lost_an_epoch():
    # Seed 0's curve lost its epoch-2 row (as a committed table96 row did); averaging by
    # position would put its fine-tuned point beside the other seed's last epoch.
    whole = _finetuned(_row("96-g16-gn-reduced", 1, [(0.50, 10.0), (0.60, 20.0), (0.70, 30.0)],
                            0.9), finetune_seconds=5.0, after=0.90)
    gapped = _finetuned(_row("96-g16-gn-reduced", 0, [(0.40, 10.0), (0.62, 30.0)], 0.9),
                        finetune_seconds=5.0, after=0.80)
    gapped["curve"][1]["epoch"] = 3
    points = protocol.seed_points([protocol.timeline(gapped), protocol.timeline(whole)])
    assert [[q["epoch"] for q in p] for p in points] == [[1, 1], [3, 3], [3, 3]]
    assert [sum(q["val_top1"] for q in p) / 2 for p in points] == pytest.approx(
        [0.45, 0.66, 0.85])  # epoch 1, epoch 3, then the fine-tuned models
    assert [q["finetuned"] for q in points[-1]] == [True, True]
    # without a fine-tuned point for every seed, the line stops at the last common epoch
    points = protocol.seed_points([protocol.timeline(gapped), protocol.timeline(whole)[:-1]])
    assert len(points) == 2


def test_quiet_rates_turn_images_seen_into_seconds():
    reference = "96-g1-bn-native"
    ref = {**_row(reference, 0, [(0.80, 999.0), (0.90, 1999.0)], 0.89),
           "epochs": 2, "train_images": 2 * 12800}
    reduced = _finetuned(_row("96-g16-lnpn-reduced", 0, [(0.85, 40.0), (0.88, 80.0)], 0.9),
                         finetune_seconds=15.0, after=0.91)
    rates = {reference: {"train": 64.0, "finetune": None},
             "96-g16-lnpn-reduced": {"train": 256.0, "finetune": 128.0}}
    summary = protocol.summarize([ref, reduced], "table96", rates)
    # The reference: 12,800 images an epoch at 64 img/s, 200 s an epoch; reaches 0.90 at 400.
    assert summary[reference]["quiet_seconds_to_target"]["mean"] == pytest.approx(400.0)
    # Reduced: 2 epochs at 256 img/s (100 s), then 6,400 fine-tune images at 128 (50 s).
    assert summary["96-g16-lnpn-reduced"]["quiet_seconds"]["mean"] == pytest.approx(150.0)
    assert summary["96-g16-lnpn-reduced"]["quiet_seconds_to_target"]["mean"] == \
        pytest.approx(150.0)
    lines = protocol.claim_b(summary, "table96")
    assert "0.38x the reference's" in lines[2]  # 150 / 400 = 0.375
    rates["96-g16-lnpn-reduced"]["finetune"] = None  # no fine-tune rate: its own seconds
    summary = protocol.summarize([ref, reduced], "table96", rates)
    assert summary["96-g16-lnpn-reduced"]["quiet_seconds"]["mean"] == pytest.approx(115.0)


def test_claim_b_also_says_when_the_reference_reaches_each_recipes_final_accuracy():
    reference = "96-g1-bn-native"

    def ref(seed, curve):
        return {**_row(reference, seed, [(v, 1.0) for v in curve], 0.9),
                "epochs": 3, "train_images": 3 * 12800}

    def reduced(seed, after):
        return _finetuned(_row("96-g16-lnpn-reduced", seed, [(0.70, 1.0), (0.80, 2.0)], 0.8),
                          finetune_seconds=1.0, after=after)

    rows = [ref(0, [0.80, 0.851, 0.92]), ref(1, [0.82, 0.849, 0.90]),
            reduced(0, 0.84), reduced(1, 0.86)]
    rates = {reference: {"train": 64.0, "finetune": None},
             "96-g16-lnpn-reduced": {"train": 256.0, "finetune": 128.0}}
    summary = protocol.summarize(rows, "table96", rates)
    # The reduced recipe ends at 0.85 on average, below the target (0.91). At 200 quiet s an
    # epoch the reference passes 0.85 in its second epoch at seed 0 (0.851: 400 s) and its
    # third at seed 1 (0.849 falls short: 600 s): 500 +/- t(0.975, 1) x 100 = 1270.6. The
    # reduced run takes 2 epochs at 256 img/s (100 s) and 6,400 fine-tune images at 128
    # (50 s): 150 s.
    back = summary["96-g16-lnpn-reduced"]["reference_quiet_seconds_to_final"]
    assert back["mean"] == pytest.approx(500.0)
    assert back["half_width"] == pytest.approx(12.7062 * 100.0, rel=1e-4)
    assert summary["96-g16-lnpn-reduced"]["reference_reached_final"] == 2
    line = protocol.claim_b(summary, "table96")[2]
    assert "never reaches it" in line
    assert "the reference first reaches 0.8500 after 500 +/- 1271 s in 2 of 2 seed(s)" in line
    assert "3.33x this recipe's" in line
    # A recipe that ends above every reference curve: no seed of the reference gets there.
    rows[2:] = [reduced(0, 0.93), reduced(1, 0.95)]
    summary = protocol.summarize(rows, "table96", rates)
    assert summary["96-g16-lnpn-reduced"]["reference_quiet_seconds_to_final"] is None
    assert summary["96-g16-lnpn-reduced"]["reference_reached_final"] == 0
    # Without the quiet rates there are no quiet seconds to compare.
    assert "reference_quiet_seconds_to_final" not in protocol.summarize(
        rows, "table96")["96-g16-lnpn-reduced"]


def test_a_quiet_axis_chart_names_the_speed_pass_load_not_the_runs():
    rows = [{"machine": {"cpu": "AMD EPYC", "cores": 2, "load_average_1m": 6.73}}]
    rates = {"a": {"load_average_mean": 1.31}, "b": {"load_average_mean": 1.8}}
    machine = protocol.chart_machine(rows, rates, ["a", "b"])
    assert machine["load_average_1m"] == "1.80 (speed pass)"
    assert rows[0]["machine"]["load_average_1m"] == 6.73  # the row itself is left alone
    assert protocol.chart_machine(rows, None, ["a"])["load_average_1m"] == 6.73


def test_speed_rates_keep_the_best_round_of_the_current_recipe_text(tmp_path):
    overrides = dict(protocol.SPEED)
    recipe = "96-g16-lnpn-reduced"

    def row(round_, ips, tune, digest=None, quiet=True):
        key = json.loads(protocol.speed_key(recipe, round_, overrides))
        key["digest"] = digest or key["digest"]
        return {"experiment": "table96", "recipe": recipe, "images_per_second": ips,
                "finetune_images_per_second": tune, "run_key": json.dumps(key),
                "overrides": overrides, "quiet": quiet, "load_average_mean": 1.0}

    path = tmp_path / protocol.SPEED_FILE
    path.write_text("\n".join(json.dumps(r) for r in [
        row(0, 200.0, 100.0), row(1, 250.0, 90.0, quiet=False),
        row(2, 999.0, 999.0, digest="an-older-recipe")]) + "\n")
    rates = protocol.speed_rates(path, "table96", quick=False, smoke=False)
    assert rates[recipe]["train"] == 250.0 and rates[recipe]["finetune"] == 100.0
    assert rates[recipe]["rounds"] == 2 and rates[recipe]["spread"] == 0.25
    assert rates[recipe]["quiet"] is False


def test_the_speed_pass_measures_the_reference_first_and_skips_rounds_it_has(tmp_path,
                                                                          monkeypatch):
    calls = []

    def fake_measure(experiment, recipe, round_, args, path, runs, reference_ips):
        calls.append((recipe, round_, reference_ips))
        row = {"run_key": protocol.speed_key(recipe, round_, protocol.speed_overrides(args)),
               "images_per_second": 100.0 + round_, "finetune_images_per_second": None,
               "load_average_mean": 1.0}
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    monkeypatch.setattr(protocol, "measure_speed", fake_measure)
    args = protocol.build_parser().parse_args(["table96", "--speed-rounds", "2"])
    path = tmp_path / protocol.SPEED_FILE
    recipes = ["96-g16-lnpn-reduced", "96-g1-bn-native"]
    protocol.speed_pass("table96", recipes, args, path, tmp_path)
    # The reference leads each round, and the others get its rate from the same round.
    assert calls == [("96-g1-bn-native", 0, None), ("96-g16-lnpn-reduced", 0, 100.0),
                     ("96-g1-bn-native", 1, None), ("96-g16-lnpn-reduced", 1, 101.0)]
    calls.clear()
    args.speed_rounds = 3  # a third round: the first two are in the file
    protocol.speed_pass("table96", recipes, args, path, tmp_path)
    assert calls == [("96-g1-bn-native", 2, None), ("96-g16-lnpn-reduced", 2, 102.0)]


def test_a_run_directory_of_another_recipe_version_is_not_resumed_or_reused(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(protocol, "FLAGS_DIR", tmp_path)
    (tmp_path / "fashion-mnist-x.flags").write_text(
        "# x\n--finetune_epochs=2\n--crop_area_min=0.444444\n--eval_flip\n--seed=0\n"
        "--model_dir=runs/x\n--dataset=fashion_mnist\n")
    key = protocol.run_key("x", 0, {})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # Unfinished and without a key (started before keys were written): resumed as before.
    assert protocol.run_dir_is_stale(run_dir, key, "x", {}) is None
    # Finished without a key: compared flag by flag with its config.json.
    config = {"finetune_epochs": 1, "crop_area_min": 0.444444, "eval_flip": True,
              "dataset": "fashion_mnist", "seed": 7, "not_a_flag_of_the_recipe": 3}
    (run_dir / "config.json").write_text(json.dumps({"config": config}))
    (run_dir / "results.json").write_text("{}")
    assert protocol.run_dir_is_stale(run_dir, key, "x", {}) == (
        "it finished with --finetune_epochs (run 1, recipe '2')")
    config["finetune_epochs"] = 2  # the seed is the run's own flag: not compared
    (run_dir / "config.json").write_text(json.dumps({"config": config}))
    assert protocol.run_dir_is_stale(run_dir, key, "x", {}) is None
    config["eval_flip"] = False
    (run_dir / "config.json").write_text(json.dumps({"config": config}))
    assert "--eval_flip" in protocol.run_dir_is_stale(run_dir, key, "x", {})
    # With the key written by the benchmark, the key alone decides.
    (run_dir / protocol.RUN_KEY_FILE).write_text(json.dumps({"run_key": key}))
    assert protocol.run_dir_is_stale(run_dir, key, "x", {}) is None
    assert protocol.run_dir_is_stale(run_dir, protocol.run_key("x", 0, {"epochs": 3}), "x",
                                     {}) == "it was started for another version of the recipe"
