"""Every module of every `make benchmark-*` target runs end to end with --smoke (issue 37: a
renamed argument broke `make benchmark-distribute` and no check ran it).

The modules run as subprocesses, 2 side by side (benchmarks.targets.smoke, what `make
benchmark-smoke` runs), once for the whole file and only those whose tests were selected; each
test then checks one module: exit status 0 within the timeout, rows in the shared schema marked
as smoke rows in its own folder, and nothing written to benchmarks/results. Speed is not
asserted: all 14 module runs take part in make test (issue 37 asks for at most 90 s added on 2
quiet cores; each smoke run exercises its module's code paths once at the fewest steps and
smallest sizes, see SMOKE in each module and smoke_args in benchmarks/targets.py).
"""

import os
import re
from pathlib import Path

import pytest

from benchmarks import bench_model, common, targets
from tests.benchmarks.test_benchmarks_harness import (
    check_layer_rows,
    check_model_rows,
    check_pipeline_rows,
)

pytestmark = pytest.mark.tf_only

REPO = Path(__file__).resolve().parents[2]
STEPS = targets.smoke_steps(list(targets.TARGETS))
JOBS = 2  # modules side by side: the machine has 2 cores
# Make targets that run no benchmark module of their own.
NOT_MODULE_TARGETS = {"benchmark", "benchmark-quick", "benchmark-smoke", "benchmark-deps",
                      "benchmark-fashion", "benchmark-gpu-wheels", "benchmark-gpu-smoke"}


# The tests that read a module's smoke run, each parametrised by the module's label.
SMOKE_ROW_TESTS = {"test_benchmark_module_runs_in_smoke_mode",
                   "test_protocol_rows_say_whether_the_training_process_ran_onednn",
                   "test_model_benchmark_smoke_steps_every_layer_and_model_configuration",
                   "test_pipeline_benchmark_smoke_steps_every_configuration"}


def listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def smoke_runs(request, tmp_path_factory):
    # Only the modules whose tests were selected (-k bench_stop_vote runs that one alone).
    selected = {item.callspec.params["label"] for item in request.session.items
                if getattr(item, "originalname", "") in SMOKE_ROW_TESTS}
    before = listing(common.RESULTS_DIR)
    root = tmp_path_factory.mktemp("smoke")
    results = targets.smoke(list(targets.TARGETS), root, jobs=JOBS, only=selected)
    return {r.label: r for r in results}, before


@pytest.mark.parametrize("label", [step.label for _, step in STEPS])
def test_benchmark_module_runs_in_smoke_mode(smoke_runs, label):
    results, before = smoke_runs
    result = results[label]
    if result.status is None and not result.failed:
        pytest.skip(f"{label}: {result.reason}")
    assert not result.failed, (f"{label} failed (exit status {result.status}, "
                               f"{result.reason or 'no timeout'}):\n{result.output}")
    files = sorted(result.directory.glob("*.jsonl"))
    assert files, f"{label} wrote no rows to {result.directory}:\n{result.output}"
    for path in files:
        rows = common.read_rows(path)
        assert rows, path
        for row in rows:
            common.validate_row(row)
            assert row.get("smoke") is True, (path, row)
    # The smoke runs wrote nothing to benchmarks/results (no file added, none rewritten).
    assert listing(common.RESULTS_DIR) == before


@pytest.mark.parametrize("label", ["bench_model"])
def test_model_benchmark_smoke_steps_every_layer_and_model_configuration(smoke_runs, label):
    # What test_benchmarks_harness's in-process run of the same configuration checked (now a
    # slow test: it repeated this run, 15 s of make test), read from the smoke run's rows.
    results, _ = smoke_runs
    directory = results[label].directory
    layers = common.read_rows(directory / "layers_tensorflow.jsonl")
    check_layer_rows(layers)
    models = common.read_rows(directory / "model_tensorflow.jsonl")
    # --no-timm: our variants and keras.applications' B0 only, each row saying timm was left out.
    variants = [bench_model.BASELINE, *bench_model.VARIANTS]
    check_model_rows(models, variants)
    assert all(r["gmacs"] > 0 and r["timm_status"] == "timm peer left out (--no-timm)"
               for r in models)


@pytest.mark.parametrize("label", ["bench_pipeline"])
def test_pipeline_benchmark_smoke_steps_every_configuration(smoke_runs, label):
    # What test_benchmarks_harness's in-process run of the same options checked (now slow).
    results, _ = smoke_runs
    rows = common.read_rows(results[label].directory / "pipeline.jsonl")
    check_pipeline_rows(rows)


def test_every_benchmark_module_and_make_target_has_a_smoke_run():
    # A new bench_*.py (the deployment or Figure-1 benchmark) or make target must join
    # benchmarks/targets.py: then this file runs it.
    modules = {path.stem for path in (REPO / "benchmarks").glob("bench_*.py")}
    assert modules == {step.module for steps in targets.TARGETS.values() for step in steps}
    makefile = (REPO / "Makefile").read_text()
    make_targets = set(re.findall(r"^(benchmark[\w-]*):", makefile, re.M))
    assert make_targets - NOT_MODULE_TARGETS == set(targets.TARGETS)
    # Every module the Makefile starts directly is in the table too.
    direct = set(re.findall(r"-m benchmarks\.(bench_\w+)", makefile))
    assert direct <= modules


def test_a_smoke_run_never_writes_to_benchmarks_results(tmp_path, monkeypatch):
    monkeypatch.delenv(common.RESULTS_ENV, raising=False)
    for inside in (common.RESULTS_DIR, common.RESULTS_DIR / "smoke"):
        with pytest.raises(ValueError, match="--smoke writes no rows to"):
            common.smoke_dir(inside)
    assert common.smoke_dir(tmp_path) == tmp_path.resolve()
    made = common.smoke_dir()
    assert made.is_dir() and common.RESULTS_DIR not in made.parents
    made.rmdir()


def test_smoke_and_quick_presets_yield_to_the_command_line(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-dir", default=None)
    common.add_mode_arguments(parser)
    smoke, quick = ["--steps=4", "--rounds=1"], ["--rounds=2"]
    args = common.parse_args(parser, ["--smoke", "--rounds=5", "--output-dir", str(tmp_path)],
                             smoke=smoke, quick=quick)
    assert (args.steps, args.rounds, args.mode) == (4, 5, common.RunMode(smoke=True))
    args = common.parse_args(parser, ["--quick"], smoke=smoke, quick=quick)
    assert (args.steps, args.rounds, args.output_dir) == (20, 2, None)
    assert args.mode.file_name("pipeline") == "pipeline_quick"
    assert args.mode.mark({"a": 1}) == {"a": 1, "quick": True}
    with pytest.raises(SystemExit):
        common.parse_args(parser, ["--smoke", "--quick"], smoke=smoke, quick=quick)


def test_rows_name_step_calls_under_either_name():
    # Rows written before issue 37 say steps_per_epoch (step calls); later ones say so.
    committed = common.read_rows(common.RESULTS_DIR / "pareto.jsonl")
    assert [common.step_calls_per_epoch(row) for row in committed] == [
        row["steps_per_epoch"] for row in committed]
    assert common.step_calls_per_epoch({"step_calls_per_epoch": 7, "updates_per_epoch": 14}) == 7
    assert common.step_calls_per_epoch({"updates_per_epoch": 14}) is None


@pytest.mark.parametrize("label", ["bench_fashion_protocol table96"])
def test_protocol_rows_say_whether_the_training_process_ran_onednn(smoke_runs, label):
    # Copied from each training command's results.json (TensorFlow's own answer), which the
    # variable decides where it is set: make test sets 0 and the runs inherit it.
    result = smoke_runs[0][label]
    if result.status is None and not result.failed:
        pytest.skip(f"{label}: {result.reason}")
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    rows = [row for path in sorted(result.directory.glob("fashion_protocol*.jsonl"))
            for row in common.read_rows(path)]
    assert rows, result.directory
    for row in rows:
        assert row["onednn"] in ("on", "off"), row
        if setting in ("0", "1"):
            assert row["onednn"] == ("on" if setting == "1" else "off"), row
