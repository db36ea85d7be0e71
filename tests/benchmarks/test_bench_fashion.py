"""benchmarks/bench_fashion.py: its Student-t intervals against SciPy and closed forms, the row
format, and resuming (rows already written are skipped). Training is replaced by stand-ins that
return fixed results, so nothing here trains or times anything."""

import json
import math
import os

import pytest
from scipy import stats

from benchmarks import bench_fashion, charts, common

pytestmark = pytest.mark.tf_only

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 9, 29, 100])
@pytest.mark.parametrize("p", [0.975, 0.995, 0.9, 0.6])
def test_t_quantile_matches_scipy(df, p):
    assert bench_fashion.t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-6)
    assert bench_fashion.t_quantile(1 - p, df) == pytest.approx(stats.t.ppf(1 - p, df),
                                                                rel=1e-6)


def test_t_quantile_closed_forms():
    # df = 1 is Cauchy: tan(pi (p - 1/2)); df = 2: (2p - 1) sqrt(2 / (4 p (1 - p))).
    assert bench_fashion.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475),
                                                               rel=1e-6)
    p = 0.975
    assert bench_fashion.t_quantile(p, 2) == pytest.approx(
        (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-6)
    assert bench_fashion.t_cdf(0.0, 7) == 0.5


def test_mean_interval_matches_scipy_t_interval():
    values = [0.8812, 0.8790, 0.8861, 0.8733]
    result = bench_fashion.mean_interval(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=sum(values) / len(values),
                                 scale=stats.sem(values))
    assert result["n"] == 4
    assert result["mean"] == pytest.approx((low + high) / 2)
    assert result["half_width"] == pytest.approx((high - low) / 2, rel=1e-6)
    one = bench_fashion.mean_interval([0.9])
    assert one["half_width"] is None and one["mean"] == 0.9
    with pytest.raises(ValueError):
        bench_fashion.mean_interval([])


def test_paired_difference_uses_common_seeds_and_says_whether_zero_is_excluded():
    a = {0: 0.90, 1: 0.91, 2: 0.92, 3: 0.5}
    b = {0: 0.88, 1: 0.89, 2: 0.905}
    diff = bench_fashion.paired_difference(a, b)
    assert diff["seeds"] == [0, 1, 2]
    expected = bench_fashion.mean_interval([0.02, 0.02, 0.015])
    assert diff["mean"] == pytest.approx(expected["mean"])
    assert diff["half_width"] == pytest.approx(expected["half_width"])
    assert diff["separated"]  # all three differences are positive and close
    noisy = bench_fashion.paired_difference({0: 0.9, 1: 0.8}, {0: 0.85, 1: 0.86})
    assert not noisy["separated"]
    assert bench_fashion.paired_difference({0: 0.9}, {1: 0.9}) is None


def fake_recipe_result(config, bn_batches=64):
    # A deterministic stand-in per recipe and seed: no training.
    offset = {"efficientnet-tiny-g1-bn": 0.0, "efficientnet-tiny-g16-gn": 0.01,
              "efficientnet-tiny-g16-lnpn": 0.02}[config.model]
    result = {"top1": 0.85 + offset + 0.001 * config.seed, "top5": 0.99,
              "images_per_second": 100.0 + 100 * offset * 100,
              "finetune_images_per_second": None, "train_seconds": 10.0 + config.seed,
              "finetune_seconds": 1.0, "bn_seconds": 0.0,
              "updates_per_epoch": config.updates_per_epoch}
    if config.model.endswith("-bn"):
        result.update(top1_moving_averages=0.1, bn_seconds=0.5)
    return result


def time_args(tmp_path, *extra):
    return ["time", "--epochs", "1", "--updates-per-epoch", "3", "--eval-steps", "1",
            "--note", "test", "--output-dir", str(tmp_path), *extra]


def test_time_rows_are_appended_per_run_and_skipped_on_restart(tmp_path, monkeypatch):
    calls = []

    def stand_in(config, bn_batches):
        calls.append((config.model, config.seed))
        return fake_recipe_result(config)

    monkeypatch.setattr(bench_fashion, "train_recipe", stand_in)
    path = tmp_path / "fashion_time.jsonl"
    bench_fashion.main(time_args(tmp_path, "--seeds", "0"))
    assert len(calls) == 3
    first = path.read_text()
    # Restarted with one more seed: seed 0's three rows are kept and not run again.
    summary = bench_fashion.main(time_args(tmp_path, "--seeds", "0", "1"))
    assert calls[3:] == [("efficientnet-tiny-g1-bn", 1), ("efficientnet-tiny-g16-gn", 1),
                         ("efficientnet-tiny-g16-lnpn", 1)]
    assert path.read_text().startswith(first)
    rows = charts.read_rows(path)
    assert len(rows) == 6
    assert summary[bench_fashion.BASELINE]["seeds"] == [0, 1]
    # A different schedule is a different run: it trains again, and the summary keeps apart.
    summary = bench_fashion.main(time_args(tmp_path, "--seeds", "0", "--finetune-epochs", "2"))
    assert len(calls) == 9 and len(charts.read_rows(path)) == 9
    assert summary[bench_fashion.BASELINE]["seeds"] == [0]
    assert (tmp_path / "fashion_time.png").read_bytes()[:8] == PNG_MAGIC


def test_an_edited_flagfile_is_a_different_run_but_an_edited_comment_is_not(tmp_path,
                                                                             monkeypatch):
    calls = []

    def stand_in(config, bn_batches):
        calls.append(config.model)
        return fake_recipe_result(config)

    flags_dir = tmp_path / "flags"
    flags_dir.mkdir()
    for name in bench_fashion.RECIPES.values():
        (flags_dir / name).write_text((bench_fashion.FLAGS_DIR / name).read_text())
    monkeypatch.setattr(bench_fashion, "FLAGS_DIR", flags_dir)
    monkeypatch.setattr(bench_fashion, "train_recipe", stand_in)
    bench_fashion.main(time_args(tmp_path, "--seeds", "0"))
    gn = flags_dir / "fashion-mnist-96-g16-gn-reduced.flags"
    gn.write_text("# another measured figure\n" + gn.read_text())
    bench_fashion.main(time_args(tmp_path, "--seeds", "0"))
    assert len(calls) == 3  # a comment is not the recipe: every row is kept
    gn.write_text(gn.read_text().replace("--learning_rate=0.002", "--learning_rate=0.004"))
    bench_fashion.main(time_args(tmp_path, "--seeds", "0"))
    assert len(calls) == 6  # the recipes changed: the earlier rows do not stand for them
    gn.write_text(gn.read_text().replace("--epochs=12", "--epochs=18"))
    bench_fashion.main(time_args(tmp_path, "--seeds", "0"))
    assert len(calls) == 6  # the benchmark sets the length itself: the rows still stand


def test_every_flag_left_out_of_the_digest_is_set_by_the_run(tmp_path):
    # A flag outside the recipes' digest must never reach a run from its flagfile: each one
    # takes the run's value, none the flagfile's.
    args = bench_fashion.build_parser().parse_args(
        ["time", "--epochs", "3", "--updates-per-epoch", "7", "--finetune-epochs", "2",
         "--warmup-epochs", "0.25"])
    for label in bench_fashion.RECIPES:
        config = bench_fashion.recipe_config(label, 11, args, tmp_path / "run")
        run = dict(epochs=3, updates_per_epoch=7, finetune_epochs=2, warmup_epochs=0.25,
                   seed=11, model_dir=str(tmp_path / "run"), eval_split="test")
        assert set(run) == set(bench_fashion.REPLACED_FLAGS)
        assert {name: getattr(config, name) for name in run} == run


def microbatch_args(*argv: str):
    args = bench_fashion.build_parser().parse_args(["microbatch", *argv])
    bench_fashion.schedule_defaults(args)
    return args


def test_the_smoke_schedule_keeps_the_regularization_its_rows_ran_with():
    base = bench_fashion.microbatch_base(microbatch_args("--schedule", "smoke"))
    # The rows in benchmarks/results/fashion_microbatch.jsonl ran with these settings, whatever
    # flags/fashion-mnist-g16-lnpn-native.flags says now.
    assert (base.crop_area_min, base.label_smoothing, base.dropout_rate,
            base.drop_connect_rate) == (0.25, 0.1, 0.1, 0.1)
    assert base.eval_resize_ratio == pytest.approx(256 / 224)
    assert (base.train_resolution, base.test_resolution) == (32, 32)
    assert (base.epochs, base.updates_per_epoch) == (1, 100)


def test_the_smoke_schedule_reports_the_committed_rows_as_a_smoke_pass(monkeypatch):
    # The committed 100-update rows are found by the smoke schedule (same schedule dict) and
    # their chart is titled a smoke pass; the means are the rows' own, computed here directly.
    path = common.RESULTS_DIR / "fashion_microbatch.jsonl"
    titles = []
    monkeypatch.setattr(bench_fashion, "draw_microbatch_chart",
                        lambda path, rows, summary, label: titles.append(label))
    summary = bench_fashion.report_microbatch(
        path, bench_fashion.microbatch_schedule(microbatch_args("--schedule", "smoke")), "smoke")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(summary) == 8 and sum(len(s["seeds"]) for s in summary.values()) == len(rows)
    for (norm, micro), s in summary.items():
        own = [r["top1"] for r in rows if (r["variant"], r["micro_batch"]) == (norm, micro)]
        assert s["top1"]["mean"] == pytest.approx(sum(own) / len(own))
    assert titles and titles[0].startswith("SMOKE PASS")


def test_the_long_schedule_is_the_native_recipe_at_one_global_batch():
    # Both micro-batches: the flagfile's 40 px recipe (its crops, no dropout), the same 859
    # updates of 64 per epoch (55,000 // 64) and the flagfile's peak rate 0.002 for 64 images.
    from benchmarks import bench_microbatch

    args = microbatch_args()
    base = bench_fashion.microbatch_base(args)
    assert (base.train_resolution, base.test_resolution, base.epochs) == (40, 40, 3)
    assert (base.crop_area_min, base.dropout_rate, base.eval_resize_ratio) == (0.85, 0.0, 1.0)
    assert (base.weight_average_decay, base.eval_every, base.eval_split) == (0.0, 0, "test")
    for micro, accumulation in ((2, 32), (32, 2)):
        config = bench_microbatch.run_config(base, "BN", micro, args.global_batch, 0, "run")
        assert (config.micro_batch_size, config.gradient_accumulation) == (micro, accumulation)
        assert config.plan.updates_per_epoch(55_000, config.updates_per_epoch) == 859
        assert config.peak_learning_rate() == pytest.approx(0.002)
    assert bench_fashion.microbatch_schedule(args)["name"] == "long"


def test_each_long_run_has_its_own_folder_per_schedule(tmp_path):
    args = microbatch_args()
    schedule = bench_fashion.microbatch_schedule(args)
    folders = {bench_fashion.run_directory(tmp_path, schedule, norm, micro, seed)
               for norm in ("BN", "LN+PN") for micro in (2, 32) for seed in (0, 1)}
    assert len(folders) == 8 and len({f.parent for f in folders}) == 1
    other = bench_fashion.microbatch_schedule(microbatch_args("--epochs", "4"))
    assert (bench_fashion.run_directory(tmp_path, other, "BN", 2, 0).parent
            != bench_fashion.run_directory(tmp_path, schedule, "BN", 2, 0).parent)


def test_time_row_format(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_fashion, "train_recipe", fake_recipe_result)
    bench_fashion.main(time_args(tmp_path, "--seeds", "4"))
    rows = charts.read_rows(tmp_path / "fashion_time.jsonl")
    for row in rows:
        common.validate_row(row)
        assert row["benchmark"] == "fashion_time" and row["seed"] == 4
        assert row["reference"] == bench_fashion.BASELINE and row["eval_split"] == "test"
        assert json.loads(row["run_key"]) == {"variant": row["variant"], "micro_batch": None,
                                              "seed": 4, "schedule": row["schedule"]}
        assert row["seconds"] == pytest.approx(row["train_seconds"] + row["finetune_seconds"])
        assert row["train_images"] == 1 * 3 * 64 and row["note"] == "test"
    by_variant = {row["variant"]: row for row in rows}
    lnpn = by_variant["G16-LN+PN 64 -> 96 + head"]
    assert (lnpn["resolution"], lnpn["test_resolution"], lnpn["finetune_epochs"]) == (64, 96, 1)
    assert by_variant[bench_fashion.BASELINE]["resolution"] == 96
    baseline = by_variant[bench_fashion.BASELINE]
    assert baseline["finetune_epochs"] == 0
    assert (baseline["top1_moving_averages"], baseline["bn_seconds"]) == (0.1, 0.5)
    assert baseline["bn_statistics"] == "re-estimated on 64 training micro-batches"
    assert "top1_moving_averages" not in lnpn
    assert lnpn["ratio_to_reference"] == pytest.approx(300.0 / 100.0)
    assert lnpn["top1"] == pytest.approx(0.874)


def test_a_row_without_its_run_key_is_refused(tmp_path):
    row = common.make_row("fashion_time", machine={"cpu": "x", "cores": 2}, backend="tensorflow",
                          variant="v", resolution=32, batch=64, precision="float32",
                          images_per_second=1.0, reference="v", reference_images_per_second=1.0,
                          seed=0, top1=0.5, seconds=1.0, schedule={})
    with pytest.raises(ValueError, match="run_key"):
        bench_fashion.append_row(tmp_path / "rows.jsonl", row)
    assert not (tmp_path / "rows.jsonl").exists()


def test_microbatch_rows_resume_and_compare_norms(tmp_path, monkeypatch):
    calls = []

    def stand_in(config, bn_batches, eval_batch):
        calls.append((config.model, config.micro_batch_size, config.gradient_accumulation,
                      config.seed, eval_batch, config.resume, config.model_dir))
        result = {"images_per_second": 50.0 * config.micro_batch_size, "seconds": 5.0,
                  "updates_per_epoch": 7,
                  "top1": 0.8 if config.micro_batch_size > 2 or "bn" not in config.model
                  else 0.6}
        if config.model.endswith("-bn"):
            result["top1_moving_averages"] = 0.1
        return result

    monkeypatch.setattr(bench_fashion, "train_and_score", stand_in)
    args = ["microbatch", "--norms", "BN", "LN+PN", "--global-batch", "32",
            "--updates-per-epoch", "0", "--epochs", "2", "--output-dir", str(tmp_path),
            "--runs-dir", str(tmp_path / "runs")]
    summary = bench_fashion.main(args + ["--seeds", "0", "1"])
    assert sorted({c[:3] for c in calls}) == [
        ("efficientnet-tiny-g16-bn", 2, 16), ("efficientnet-tiny-g16-bn", 32, 1),
        ("efficientnet-tiny-g16-lnpn", 2, 16), ("efficientnet-tiny-g16-lnpn", 32, 1)]
    assert {c[4] for c in calls} == {32}  # evaluated at the global batch
    assert {c[5] for c in calls} == {True}  # each run resumes from its own folder
    assert len({c[6] for c in calls}) == 8
    assert all(c[6].startswith(str(tmp_path / "runs")) for c in calls)
    assert len(calls) == 8
    bench_fashion.main(args + ["--seeds", "0", "1"])
    assert len(calls) == 8  # everything was there
    assert not (tmp_path / "fashion_microbatch.jsonl").exists()
    rows = charts.read_rows(tmp_path / "fashion_microbatch_long.jsonl")
    assert len(rows) == 8
    for row in rows:
        common.validate_row(row)
        assert row["reference"] == "BN micro-batch 32"
        assert row["learning_rate"] == pytest.approx(rows[0]["learning_rate"])
        assert ("top1_moving_averages" in row) == (row["variant"] == "BN")
        assert row["schedule"]["name"] == row["schedule_name"] == "long"
        # updates per epoch: the trainer's count of one pass, not the option's 0
        assert (row["updates_per_epoch"], row["train_images"]) == (7, 2 * 7 * 32)
        assert row["load_average_mean"] > 0
    assert summary[("BN", 2)]["top1"]["mean"] == pytest.approx(0.6)
    assert summary[("LN+PN", 2)]["top1"]["half_width"] == pytest.approx(0.0)
    assert (tmp_path / "fashion_microbatch_long.png").read_bytes()[:8] == PNG_MAGIC


def test_a_stopped_run_is_one_line_and_keeps_the_finished_rows(tmp_path, monkeypatch,
                                                                capsys):
    import signal

    from keras_efficientnet.training.preemption import Preempted

    def stand_in(config, bn_batches, eval_batch):
        if config.micro_batch_size == 2:  # SIGTERM while the second run trains
            raise Preempted(signal.SIGTERM, tmp_path / "checkpoint", 7)
        return {"images_per_second": 10.0, "seconds": 5.0, "updates_per_epoch": 3, "top1": 0.5}

    monkeypatch.setattr(bench_fashion, "train_and_score", stand_in)
    with pytest.raises(SystemExit) as stopped:
        bench_fashion.main(["microbatch", "--norms", "LN", "--seeds", "0", "--output-dir",
                            str(tmp_path), "--runs-dir", str(tmp_path / "runs")])
    assert stopped.value.code == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip()
    assert err.startswith("seed 0 LN micro-batch 2: stopped by SIGTERM after step 7")
    assert "resume" in err and len(err.splitlines()) == 1
    rows = charts.read_rows(tmp_path / "fashion_microbatch_long.jsonl")
    assert [(r["variant"], r["micro_batch"]) for r in rows] == [("LN", 32)]


def test_bad_arguments_are_one_line_errors(capsys):
    with pytest.raises(SystemExit):
        bench_fashion.main(["microbatch", "--micro-batches", "3", "--global-batch", "32"])
    assert "--micro-batches [3]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_fashion.main(["time", "--seeds", "0", "0"])
    assert "--seeds distinct" in capsys.readouterr().err


REAL = "/usr/share/datasets/fashion-mnist"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(REAL),
                    reason=f"Fashion-MNIST is not installed in {REAL} (make data-fashion)")
def test_both_experiments_train_on_the_real_files(tmp_path):
    # A few updates each, through the real trainer: the rows, the re-estimated G1-BN score and
    # the charts come out; the figures themselves mean nothing at this length.
    bench_fashion.main(["time", "--recipes", bench_fashion.BASELINE,
                        "G16-LN+PN 64 -> 96 + head", "--updates-per-epoch", "2",
                        "--eval-steps", "1", "--bn-batches", "2", "--seeds", "0",
                        "--output-dir", str(tmp_path)])
    rows = charts.read_rows(tmp_path / "fashion_time.jsonl")
    assert [r["variant"] for r in rows] == [bench_fashion.BASELINE,
                                            "G16-LN+PN 64 -> 96 + head"]
    assert rows[0]["bn_seconds"] > 0 and 0 <= rows[0]["top1_moving_averages"] <= 1
    assert rows[1]["finetune_seconds"] > 0 and rows[1]["resolution"] == 64
    microbatch = ["microbatch", "--norms", "BN", "LN+PN", "--micro-batches", "2", "4",
                  "--global-batch", "4", "--epochs", "2", "--updates-per-epoch", "2",
                  "--eval-steps", "1", "--bn-batches", "2", "--seeds", "0",
                  "--output-dir", str(tmp_path), "--runs-dir", str(tmp_path / "runs")]
    bench_fashion.main(microbatch)
    rows = charts.read_rows(tmp_path / "fashion_microbatch_long.jsonl")
    assert sorted((r["variant"], r["micro_batch"]) for r in rows) == [
        ("BN", 2), ("BN", 4), ("LN+PN", 2), ("LN+PN", 4)]
    # Each run trained its 2 epochs in its own folder, which keeps its seconds for a resume.
    for row in rows:
        run = bench_fashion.run_directory(tmp_path / "runs", row["schedule"], row["variant"],
                                          row["micro_batch"], 0)
        assert (run / "metrics.csv").read_text().splitlines()[-1].startswith("2,")
        kept = json.loads((run / bench_fashion.SECONDS_FILE).read_text())["train_seconds"]
        assert row["seconds"] == pytest.approx(kept, abs=0.01) and not row["resumed"]
    # A resumed run: the row removed, its run directory kept: the trainer resumes at its end
    # (no update), the score comes again from the same final weights, and the seconds go on
    # from the first process's.
    kept = [r for r in rows if (r["variant"], r["micro_batch"]) != ("LN+PN", 2)]
    (tmp_path / "fashion_microbatch_long.jsonl").write_text(
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    bench_fashion.main(microbatch)
    again = charts.read_rows(tmp_path / "fashion_microbatch_long.jsonl")
    before = next(r for r in rows if (r["variant"], r["micro_batch"]) == ("LN+PN", 2))
    assert again[-1]["top1"] == before["top1"] and again[-1]["resumed"]
    assert again[-1]["seconds"] > before["seconds"]
    for name in ("fashion_time", "fashion_microbatch_long"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == PNG_MAGIC


def test_a_runs_seconds_add_up_over_the_processes_that_trained_it(tmp_path):
    assert bench_fashion.add_train_seconds(tmp_path, 12.5) == pytest.approx(12.5)
    assert bench_fashion.add_train_seconds(tmp_path, 7.25) == pytest.approx(19.75)
    saved = json.loads((tmp_path / bench_fashion.SECONDS_FILE).read_text())
    assert saved == {"train_seconds": 19.75}
