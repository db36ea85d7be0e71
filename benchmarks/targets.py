"""The `make benchmark-*` targets as data, and the runner that prints their expected duration,
resumes a stopped run and smoke-tests every module.

`python -m benchmarks.targets run [--quick] [--force] TARGET... [-- OPTIONS]` runs the modules of
each target (TARGETS) one after the other. First it prints how long they should take on this
machine: the wall times recorded in benchmarks/results/wall_times.json by the last run of each
module here (same CPU model and core count), 'unknown' where none was recorded. A module whose
result files already hold rows of the same resume key (the module and its options, quick or not,
the code of keras_efficientnet/ and benchmarks/, the flagfiles, the library versions and the
CPU) is skipped: a stopped `make benchmark` resumes with the first module that did not finish.
`--force` measures again. OPTIONS go to every module of the targets.

`python -m benchmarks.targets estimate [--quick] TARGET...` prints the expectation only;
`python -m benchmarks.targets smoke [TARGET...]` runs every module with --smoke (a few steps at
tiny sizes, rows to a temporary folder), some side by side, and fails if any fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from benchmarks.common import RunMode, machine, results_dir

REPO = Path(__file__).resolve().parents[1]
WALL_TIMES = "wall_times.json"
# The interpreter of the GPU benchmark's CPU smoke run: Keras and JAX, no TensorFlow
# (`make install-jax`); the smoke run skips it, saying why, where it is missing.
JAX_PYTHON = os.environ.get("KE_JAX_PYTHON", str(REPO / ".venv-jax" / "bin" / "python"))
# What the resume key digests: the code and recipes a benchmark runs.
CODE_GLOBS = ("keras_efficientnet/**/*.py", "benchmarks/*.py", "benchmarks/gpu/*.sh",
              "flags/*.flags")
LIBRARIES = ("keras", "tensorflow", "jax", "numpy")
# One smoke module takes 10-45 CPU seconds; a shared machine at load 16 stretched the longest to
# 4 minutes of wall time. A hung one still fails.
SMOKE_TIMEOUT_S = 600


def fashion_mnist_missing() -> str | None:
    """Why the Fashion-MNIST modules cannot run here, or None. Its reader checks the files'
    published MD5s, so a stand-in set would be refused: without the files they are skipped."""
    from keras_efficientnet.datasets.sources import fashion_mnist

    folder = Path(fashion_mnist.DEFAULT_DIR)
    stems = list(fashion_mnist.MD5)
    if all((folder / f"{stem}.gz").is_file() or (folder / stem).is_file() for stem in stems):
        return None
    return f"Fashion-MNIST is not installed in {folder} (make data-fashion)"


def deploy_missing() -> str | None:
    """Why the deployment benchmark cannot run here, or None: it needs ONNX Runtime and
    OpenVINO (the `deploy` extra; timm is optional, its rows then say why it is missing)."""
    import importlib.util

    missing = [name for name in ("onnx", "onnxruntime", "openvino")
               if importlib.util.find_spec(name) is None]
    return f"{', '.join(missing)} not installed (pip install -e \".[deploy]\")" if missing \
        else None


def jax_python_missing() -> str | None:
    """Why the GPU benchmark's CPU smoke run cannot run here, or None."""
    if Path(JAX_PYTHON).is_file():
        return None
    return f"no {JAX_PYTHON} (make install-jax; or set KE_JAX_PYTHON)"


@dataclasses.dataclass(frozen=True)
class Step:
    """One module run of a target.

    Args:
        module: the module under benchmarks/ (`python -m benchmarks.<module>`).
        args: its fixed arguments (a subcommand).
        results: the result files it writes (names without .jsonl); the resume check reads
            their rows. Empty for a module that resumes by itself (bench_fashion appends a row
            per finished run and skips those on a rerun).
        missing: returns why the module cannot run on this machine, or None.
        command: the whole command line instead of `python -m benchmarks.<module>` (the GPU
            benchmark's shell entry point).
        smoke_args: options its smoke run adds to --smoke.
        smoke_env: environment variables of its smoke run.
    """

    module: str
    args: tuple[str, ...] = ()
    results: tuple[str, ...] = ()
    missing: Callable[[], str | None] | None = None
    command: tuple[str, ...] = ()
    smoke_args: tuple[str, ...] = ()
    smoke_env: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return " ".join((self.module, *self.args))

    def argv(self, python: str = sys.executable) -> list[str]:
        return list(self.command) or [python, "-m", f"benchmarks.{self.module}", *self.args]


TARGETS: dict[str, tuple[Step, ...]] = {
    "benchmark-layers": (Step("bench_model", results=("layers_tensorflow", "model_tensorflow")),
                         Step("bench_group_conv", results=("onednn_tensorflow",))),
    "benchmark-pipeline": (Step("bench_pipeline", results=("pipeline",)),),
    "benchmark-distribute": (Step("bench_distribute", results=("distribute",)),
                             Step("bench_stop_vote", results=("stop_vote",))),
    "benchmark-first-hour": (Step("bench_first_hour", results=("first_hour",)),),
    # Our exports and timm's on ONNX Runtime and OpenVINO (make benchmark-deploy installs the
    # runtimes, torch and timm into the dev venv first).
    "benchmark-deploy": (Step("bench_deploy", results=("deploy",), missing=deploy_missing),),
    "benchmark-pareto": (Step("bench_pareto", results=("pareto",)),),
    "benchmark-microbatch": (Step("bench_microbatch", results=("microbatch",)),),
    "benchmark-fashion-time": (Step("bench_fashion", ("time",), missing=fashion_mnist_missing),),
    "benchmark-fashion-microbatch": (Step("bench_fashion", ("microbatch",),
                                          missing=fashion_mnist_missing),),
    # Each (recipe, seed) is a training command of its own (resumable by itself); its smoke
    # run trains on the digits: one recipe and seed, and one round of the speed pass, keep it
    # to 3 commands (the reduced recipe's fine-tune would add 24 CPU seconds: the fields its
    # rows read are checked in tests/training/test_evaluate_run.py).
    "benchmark-fashion-protocol": (Step("bench_fashion_protocol", ("table96",),
                                        smoke_args=("--recipes", "96-g1-bn-native", "--seeds",
                                                    "0", "--speed-rounds", "1")),),
    "benchmark-figure1": (Step("bench_figure1"),),
    # Its smoke run is `make benchmark-gpu-smoke`; the real one needs a GPU machine's own
    # Python (benchmarks/gpu/run.sh), so `run` leaves it to `make benchmark-gpu`.
    # On a CPU each model's XLA compile takes most of a minute: the smoke run compiles the
    # reference and one variant, with XLA's slower passes off (78 -> 45 CPU seconds here) and
    # its older CPU emitters, which compile these steps 2-3 times faster (jax 0.10: 52 -> 24).
    "benchmark-gpu": (Step("bench_gpu", command=("bash", "benchmarks/gpu/run.sh"),
                           missing=jax_python_missing, smoke_args=("--variants", "G16-LN+PN"),
                           smoke_env=(("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                                                    "--xla_llvm_disable_expensive_passes=true "
                                                    "--xla_cpu_use_fusion_emitters=false"),
                                      )),),
}
# `make benchmark` and `make benchmark-quick`.
BENCHMARK = ("benchmark-layers", "benchmark-pipeline", "benchmark-distribute",
             "benchmark-first-hour", "benchmark-deploy")


# ---------------------------------------------------------------------------- resume


def code_digest() -> str:
    """A digest of the code and recipes the benchmarks run (CODE_GLOBS), file names included."""
    digest = hashlib.sha256()
    for pattern in CODE_GLOBS:
        for path in sorted(REPO.glob(pattern)):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def library_versions() -> dict[str, str | None]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def this_machine() -> dict:
    """The CPU a figure belongs to: a recorded wall time or a row counts only on the same."""
    info = machine()
    return {"cpu": info["cpu"], "cores": info["cores"]}


def resume_key(step: Step, mode: RunMode, options: Sequence[str], code: str) -> str:
    """The identity of one module run: equal keys measure the same thing on the same machine."""
    identity = {"step": step.label, "quick": mode.quick, "options": list(options),
                "code": code, "libraries": library_versions(), "machine": this_machine()}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def finished(step: Step, mode: RunMode, key: str, directory: Path) -> bool:
    """Whether every result file of `step` holds rows, all of them of `key`."""
    if not step.results:
        return False
    for name in step.results:
        path = directory / f"{mode.file_name(name)}.jsonl"
        if not path.is_file():
            return False
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if not rows or any(row.get("resume_key") != key for row in rows):
            return False
    return True


# ---------------------------------------------------------------------------- wall times


def read_wall_times(directory: Path) -> dict:
    path = directory / WALL_TIMES
    return json.loads(path.read_text()) if path.is_file() else {}


def record_wall_time(directory: Path, step: Step, mode: RunMode, seconds: float,
                     load: tuple[float, float], cpu_seconds: float | None = None) -> None:
    """Stores the wall time of a finished module run (atomically: a stop keeps the old file),
    with the load average before and after it and its CPU seconds (user + system time of the
    module and its children): on a shared machine the wall time is loaded, the CPU time much
    less so, which is what a quiet estimate starts from."""
    times = read_wall_times(directory)
    times.setdefault("quick" if mode.quick else "full", {})[step.label] = {
        "seconds": round(seconds, 1), **this_machine(),
        "load_average_1m": [round(load[0], 2), round(load[1], 2)],
        **({} if cpu_seconds is None else {"cpu_seconds": round(cpu_seconds, 1)}),
        "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")}
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f"{WALL_TIMES}.tmp"
    tmp.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, directory / WALL_TIMES)


def expected_seconds(step: Step, mode: RunMode, times: dict) -> float | None:
    """The recorded wall time of `step` on this machine, or None."""
    record = times.get("quick" if mode.quick else "full", {}).get(step.label)
    if record is None or {k: record.get(k) for k in ("cpu", "cores")} != this_machine():
        return None
    return record["seconds"]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def plan(targets: Sequence[str], mode: RunMode, options: Sequence[str], directory: Path,
         force: bool = False) -> list[tuple[str, Step, str, bool]]:
    """(target, step, resume key, already finished) for every module of `targets`, after
    printing the expected duration of what is left."""
    code = code_digest()
    times = read_wall_times(directory)
    steps = []
    known, unknown = 0.0, []
    lines = []
    for target in targets:
        for step in TARGETS[target]:
            key = resume_key(step, mode, options, code)
            done = not force and finished(step, mode, key, directory)
            steps.append((target, step, key, done))
            seconds = expected_seconds(step, mode, times)
            record = times.get("quick" if mode.quick else "full", {}).get(step.label, {})
            if done:
                note = "finished for this code and configuration: skipped"
            elif seconds is None:
                note = "unknown (no wall time recorded on this machine)"
                unknown.append(step.label)
            else:
                known += seconds
                # A shared machine's wall time is loaded: the load and CPU seconds say how much.
                load = record.get("load_average_1m") or []
                note = " ".join([_minutes(seconds), *(
                    [f"(recorded at load {min(load):.0f}-{max(load):.0f}"
                     + (f", {record['cpu_seconds']:.0f} CPU s)" if "cpu_seconds" in record
                        else ")")] if load else [])])
            lines.append(f"  {target:30s} {step.label:26s} {note}")
    total = (f"about {_minutes(known)}" if not unknown else
             "unknown (no wall time recorded on this machine yet)" if not known else
             f"unknown (at least {_minutes(known)}; never timed here: {', '.join(unknown)})")
    print(f"expected duration{' (quick)' if mode.quick else ''} on this machine: {total}")
    print("\n".join(lines), flush=True)
    return steps


# ---------------------------------------------------------------------------- commands


def run(targets: Sequence[str], mode: RunMode, options: Sequence[str], directory: Path,
        force: bool = False, output_dir: str | None = None) -> int:
    """Runs the unfinished modules of `targets`; the exit status of the first that fails."""
    for target, step, key, done in plan(targets, mode, options, directory, force):
        if done:
            continue
        if step.missing is not None and (reason := step.missing()):
            raise SystemExit(f"{target}: {reason}")
        argv = [*step.argv(), *(["--quick"] if mode.quick else []),
                *([] if not step.results else ["--resume-key", key]), *options,
                *(["--output-dir", output_dir] if output_dir else [])]
        print(f"\n== {target}: {' '.join(argv[1:] if not step.command else argv)}", flush=True)
        load, started = os.getloadavg()[0], time.perf_counter()
        proc = subprocess.Popen(argv, cwd=REPO)
        # wait4 rather than wait: the rusage of the module and every child it waited for.
        _, code, usage = os.wait4(proc.pid, 0)
        proc.returncode = status = os.waitstatus_to_exitcode(code)  # reaped here
        seconds, cpu = time.perf_counter() - started, usage.ru_utime + usage.ru_stime
        end_load = os.getloadavg()[0]
        if status:
            print(f"{target}: {step.label} failed (exit status {status}) after "
                  f"{_minutes(seconds)}; run it again to resume", flush=True)
            return status
        record_wall_time(directory, step, mode, seconds, (load, end_load), cpu)
        print(f"{target}: {step.label} took {_minutes(seconds)} ({cpu:.0f} CPU s; load "
              f"{load:.1f} -> {end_load:.1f})", flush=True)
    return 0


@dataclasses.dataclass
class SmokeResult:
    """One module's smoke run: its exit status (None: skipped or timed out, `reason` says
    which), wall and CPU seconds (its processes' user + system time), output tail and result
    folder."""

    label: str
    status: int | None
    seconds: float
    cpu_seconds: float
    output: str
    directory: Path
    reason: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.status) or (self.reason or "").startswith("timed out")


def smoke_steps(targets: Sequence[str]) -> list[tuple[str, Step]]:
    """(target, step) for every distinct module run of `targets`."""
    seen, steps = set(), []
    for target in targets:
        for step in TARGETS[target]:
            if step.label not in seen:
                seen.add(step.label)
                steps.append((target, step))
    return steps


def smoke_one(step: Step, directory: Path, timeout: float) -> SmokeResult:
    reason = step.missing() if step.missing else None
    if reason:
        return SmokeResult(step.label, None, 0.0, 0.0, "", directory, reason)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    env.update(step.smoke_env)
    if step.command:
        env["PYTHON"] = JAX_PYTHON
    argv = [*step.argv(), "--smoke", *step.smoke_args, "--output-dir", str(directory)]
    directory.mkdir(parents=True, exist_ok=True)
    log = directory.with_suffix(".log")
    started = time.perf_counter()
    with open(log, "w") as out:
        # Its own session, so that a timeout stops its workers and children too.
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        status, usage = None, None
        while status is None:
            pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status = os.waitstatus_to_exitcode(code)
            elif time.perf_counter() - started > timeout:
                os.killpg(proc.pid, 9)
                _, code, usage = os.wait4(proc.pid, 0)
                break
            else:
                time.sleep(0.1)
        proc.returncode = status if status is not None else -9  # reaped here, not by Popen
    seconds = time.perf_counter() - started
    output = log.read_text()[-4000:]
    cpu = usage.ru_utime + usage.ru_stime
    return SmokeResult(step.label, status, seconds, cpu, output, directory,
                       None if status is not None else f"timed out after {timeout:.0f} s")


def smoke(targets: Sequence[str], root: Path, jobs: int = 2, timeout: float = SMOKE_TIMEOUT_S,
          only: Collection[str] | None = None) -> list[SmokeResult]:
    """Every distinct module of `targets` (those labelled in `only`, where given) with --smoke,
    `jobs` at a time, each writing under root/<label>; the longest first, so that the short
    ones fill in around them."""
    steps = [(target, step) for target, step in smoke_steps(targets)
             if only is None or step.label in only]
    order = sorted(steps, key=lambda ts: SMOKE_ORDER.index(ts[1].label)
                   if ts[1].label in SMOKE_ORDER else len(SMOKE_ORDER))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        futures = {step.label: pool.submit(smoke_one, step, root / step.label.replace(" ", "-"),
                                           timeout) for _, step in order}
        return [futures[step.label].result() for _, step in steps]


# The smoke runs' order, longest first (measured on 2 cores: the multi-process ones lead).
SMOKE_ORDER = ("bench_gpu", "bench_fashion_protocol table96", "bench_stop_vote",
               "bench_group_conv", "bench_fashion time", "bench_distribute",
               "bench_fashion microbatch", "bench_microbatch", "bench_deploy", "bench_pareto",
               "bench_model", "bench_figure1", "bench_pipeline", "bench_first_hour")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "estimate"):
        sub = commands.add_parser(name)
        sub.add_argument("targets", nargs="+", metavar="TARGET",
                         help=f"one or more of {', '.join(TARGETS)}")
        sub.add_argument("--quick", action="store_true", help="fewer rounds (make "
                         "benchmark-quick): rows marked quick, in <name>_quick.jsonl")
        sub.add_argument("--force", action="store_true",
                         help="measure again modules whose rows are current")
        sub.add_argument("--output-dir", default=None,
                         help="default $KE_BENCH_RESULTS or benchmarks/results")
    sub = commands.add_parser("smoke")
    sub.add_argument("targets", nargs="*", metavar="TARGET", help="default: all")
    sub.add_argument("--jobs", type=int, default=2, help="modules run side by side")
    sub.add_argument("--output-dir", default=None, help="default: a temporary folder")
    argv = list(sys.argv[1:] if argv is None else argv)
    # Options after `--` are the modules' own.
    options = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    runnable = TARGETS if args.command == "smoke" else [
        name for name, steps in TARGETS.items() if not any(step.command for step in steps)]
    unknown = sorted(set(args.targets) - set(runnable))
    if unknown:
        parser.error(f"unknown targets {unknown}; choose from {', '.join(runnable)}")
    if args.command == "smoke":
        root = Path(args.output_dir or tempfile.mkdtemp(prefix="ke-bench-smoke-"))
        results = smoke(args.targets or list(TARGETS), root, args.jobs)
        for result in results:
            state = (f"FAILED: {result.reason}" if result.failed and result.status is None else
                     f"skipped: {result.reason}" if result.status is None else
                     "ok" if result.status == 0 else f"FAILED (exit status {result.status})")
            print(f"{result.label:26s} {result.seconds:6.1f} s wall {result.cpu_seconds:6.1f} s "
                  f"CPU  {state}")
            if result.failed:
                print(result.output)
        if not args.output_dir:
            shutil.rmtree(root, ignore_errors=True)
        return int(any(r.failed for r in results))
    directory = results_dir(args.output_dir)
    mode = RunMode(quick=args.quick)
    if args.command == "estimate":
        plan(args.targets, mode, options, directory, args.force)
        return 0
    return run(args.targets, mode, options, directory, args.force, args.output_dir)


if __name__ == "__main__":
    sys.exit(main())
