"""benchmarks/targets.py: the expected duration from recorded wall times, and resume (a module
whose rows carry the current resume key is skipped), with a stand-in module that counts its runs.
"""

import json
import sys
from pathlib import Path

import pytest

from benchmarks import common, targets

# A stand-in benchmark: appends a line to runs.log, then writes one row carrying the resume key
# it was given to <output-dir>/<name>.jsonl (<name>_quick.jsonl under --quick), as the real
# modules do through common.write_results; "--fail" makes it exit 1 after logging.
STAND_IN = """
import argparse, sys
from pathlib import Path
from benchmarks import common
parser = argparse.ArgumentParser()
parser.add_argument("--name")
parser.add_argument("--output-dir")
parser.add_argument("--fail", action="store_true")
common.add_mode_arguments(parser)
args = common.parse_args(parser, sys.argv[1:])
with open(Path(args.output_dir) / "runs.log", "a") as log:
    log.write(args.name + (" quick" if args.quick else "") + "\\n")
if args.fail:
    sys.exit(1)
row = common.make_row("train", machine=common.machine(), backend="tensorflow", variant="v",
                      resolution=32, batch=2, precision="float32", images_per_second=2.0,
                      reference="v", reference_images_per_second=2.0)
common.write_rows(args.mode.file_name(args.name), [args.mode.mark(row)], args.output_dir)
"""


@pytest.fixture
def stand_in_targets(tmp_path, monkeypatch):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", str(targets.REPO))

    def step(name, *extra):
        return targets.Step(f"stand_in {name}", results=(name,),
                            command=(sys.executable, str(script), "--name", name, *extra))

    table = {"first": (step("one"), step("two")), "second": (step("three"),),
             "broken": (step("four", "--fail"),)}
    monkeypatch.setattr(targets, "TARGETS", table)
    out = tmp_path / "results"
    out.mkdir()
    return out


def runs(out: Path) -> list[str]:
    log = out / "runs.log"
    return log.read_text().split() if log.exists() else []


def run(out: Path, *names, quick=False, force=False, options=()) -> int:
    return targets.run(list(names), common.RunMode(quick=quick), list(options), out, force,
                       str(out))


def test_a_rerun_skips_finished_modules_and_resumes_after_a_failure(stand_in_targets, capsys):
    out = stand_in_targets
    assert run(out, "first") == 0
    assert runs(out) == ["one", "two"]
    first = capsys.readouterr().out
    assert "expected duration on this machine: unknown" in first
    times = json.loads((out / targets.WALL_TIMES).read_text())["full"]
    assert set(times) == {"stand_in one", "stand_in two"}
    assert all(t["seconds"] > 0 and t["cores"] == common.machine()["cores"]
               for t in times.values())
    # The module's CPU seconds (its Python start-up and imports at least), which a loaded
    # machine stretches less than its wall time: never more than every core for the whole run.
    assert all(0 < t["cpu_seconds"] <= t["seconds"] * t["cores"] + 0.1 for t in times.values())
    # Everything finished for this code and configuration: nothing runs again, and the
    # expectation says so.
    assert run(out, "first", "second") == 0
    assert runs(out) == ["one", "two", "three"]
    printed = capsys.readouterr().out
    assert printed.count("finished for this code and configuration: skipped") == 2
    # A failing module stops the run with its status; what finished before it stays done.
    assert run(out, "second", "broken") == 1
    assert runs(out) == ["one", "two", "three", "four"]
    # Other options are another configuration; --force measures again; quick rows live apart.
    assert run(out, "second", options=["--fail"]) == 1
    assert run(out, "second", force=True) == 0
    assert run(out, "second", quick=True) == 0
    assert runs(out)[4:] == ["three", "three", "three", "quick"]
    quick_rows = common.read_rows(out / "three_quick.jsonl")
    assert quick_rows[0]["quick"] is True and "quick" not in common.read_rows(
        out / "three.jsonl")[0]


def test_the_expected_duration_adds_the_recorded_wall_times(stand_in_targets, capsys,
                                                            monkeypatch):
    out = stand_in_targets
    here = targets.this_machine()
    record = {"load_average_1m": [7.9, 3.2], "finished": "2026-12-06T07:00Z"}
    (out / targets.WALL_TIMES).write_text(json.dumps({"full": {
        "stand_in one": {"seconds": 90.0, **here, **record, "cpu_seconds": 45.0},
        "stand_in two": {"seconds": 60.0, **here, **record},
        "stand_in three": {"seconds": 30.0, **{**here, "cpu": "another CPU"}, **record}}}))
    targets.plan(["first"], common.RunMode(), [], out)
    printed = capsys.readouterr().out
    assert "expected duration on this machine: about 2.5 min" in printed
    # Beside each wall time, the load it was recorded at (and its CPU seconds, where recorded).
    assert "1.5 min (recorded at load 3-8, 45 CPU s)" in printed
    assert "1.0 min (recorded at load 3-8)\n" in printed
    # A wall time recorded on another CPU says nothing about this one.
    targets.plan(["first", "second"], common.RunMode(), [], out)
    printed = capsys.readouterr().out
    assert ("expected duration on this machine: unknown (at least 2.5 min; never timed here: "
            "stand_in three)") in printed
    # Nothing recorded for quick runs.
    targets.plan(["first"], common.RunMode(quick=True), [], out)
    assert ("(quick) on this machine: unknown (no wall time recorded on this machine yet)"
            in capsys.readouterr().out)


def test_the_resume_key_follows_the_code_options_and_mode(monkeypatch):
    step = targets.Step("bench_pipeline", results=("pipeline",))
    code = targets.code_digest()
    key = targets.resume_key(step, common.RunMode(), [], code)
    assert key == targets.resume_key(step, common.RunMode(), [], code)
    assert key != targets.resume_key(step, common.RunMode(quick=True), [], code)
    assert key != targets.resume_key(step, common.RunMode(), ["--repeats=5"], code)
    assert key != targets.resume_key(step, common.RunMode(), [], "another digest")
    monkeypatch.setattr(targets, "this_machine", lambda: {"cpu": "other", "cores": 64})
    assert key != targets.resume_key(step, common.RunMode(), [], code)


def test_unknown_targets_are_one_line_errors(capsys):
    with pytest.raises(SystemExit):
        targets.main(["run", "benchmark-nothing"])
    assert "unknown targets ['benchmark-nothing']" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the GPU benchmark needs its own machine's Python
        targets.main(["estimate", "benchmark-gpu"])
    assert "unknown targets ['benchmark-gpu']" in capsys.readouterr().err
