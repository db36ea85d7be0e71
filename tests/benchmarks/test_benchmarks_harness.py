"""Each benchmark harness takes one tiny step per configuration and writes rows and a chart.

Speed is never asserted: these check that every configuration runs, that the rows follow the
shared schema with the same-run reference, and that the PNG is written. Results go to tmp dirs.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from benchmarks import bench_model, bench_pipeline, charts, common

pytestmark = pytest.mark.tf_only

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_results(directory: Path, name: str) -> list[dict]:
    """The rows of <name>.jsonl (each valid) and its non-empty PNG."""
    rows = common.read_rows(directory / f"{name}.jsonl")
    assert rows
    for row in rows:
        common.validate_row(row)
    chart = (directory / f"{name}.png").read_bytes()
    assert chart[:8] == PNG_MAGIC and len(chart) > 1000
    return rows


def check_references(rows: list[dict], group) -> None:
    """Within each group of rows, the reference was measured and has ratio 1."""
    groups = {}
    for row in rows:
        groups.setdefault(group(row), []).append(row)
    for members in groups.values():
        (reference,) = [r for r in members if r["variant"] == r["reference"]]
        assert reference["ratio_to_reference"] == 1.0
        assert {r["reference"] for r in members} == {reference["variant"]}


def check_layer_rows(layers: list[dict]) -> None:
    """bench_model's layer rows at its smallest settings: every layer and norm, with references."""
    assert {(r["benchmark"], r["variant"]) for r in layers} == {
        ("layer_fwd_bwd", "DepthwiseConv2D"), ("layer_fwd_bwd", "GroupConv2D(group_size=16)"),
        ("layer_fwd_bwd", "keras Conv2D(groups=2)"), ("norm_fwd_bwd", "GroupNorm(4)+swish"),
        ("norm_fwd_bwd", "LayerNorm+swish"), ("norm_fwd_bwd", "GroupNorm(4)+ProxyNorm(swish)"),
        ("norm_fwd_bwd", "LayerNorm+ProxyNorm(swish)")}
    check_references(layers, lambda r: r["benchmark"])


def check_pipeline_rows(rows: list[dict]) -> None:
    """bench_pipeline's rows at 32 px: every configuration, with references, and the bytes each
    image costs on the way to the device (uint8: 1 a channel, float32: 4)."""
    assert {(r["variant"], r["resolution"]) for r in rows} == {
        ("decode_and_crop_ceiling", None), ("uint8_pipeline", 32), ("float32_pipeline", 32),
        ("uint8_unguarded", 32), ("float32_unguarded", 32)}
    check_references(rows, lambda r: r["benchmark"])
    sent = {r["variant"]: r["bytes_per_image"] for r in rows}
    assert sent["uint8_unguarded"] == 32 * 32 * 3 and sent["float32_unguarded"] == 4 * 32 * 32 * 3

def check_model_rows(models: list[dict], variants: list[str]) -> None:
    """bench_model's model rows at 32 px, batch 2: train and inference of each variant, and the
    fused serving pass of ours, with references."""
    serving = [f"{v} {bench_model.SERVING_SUFFIX}" for v in bench_model.VARIANTS]
    assert sorted((r["benchmark"], r["variant"]) for r in models) == sorted(
        [(mode, v) for mode in ("train", "inference") for v in variants]
        + [("inference", v) for v in serving])
    assert {(r["resolution"], r["batch"], r["precision"]) for r in models} == {
        (32, 2, "float32")}
    check_references(models, lambda r: (r["benchmark"], r["resolution"]))


FAKE_PEER_SECONDS = 0.25  # what the stand-in peer below reports for every timm step


def fake_interpreter(tmp_path: Path, body: str) -> str:
    """An executable standing in for .venv-timm/bin/python: it runs `body` (Python) with the
    arguments bench_model passes after `-m benchmarks.timm_peer`."""
    script = tmp_path / "peer.py"
    script.write_text(body)
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {script} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


STAND_IN_PEER = f"""
import argparse, json
from benchmarks import timm_peer
parser = argparse.ArgumentParser()
for name in ("--models", "--resolutions", "--batch", "--threads", "--warmup", "--steps",
             "--infer-steps"):
    parser.add_argument(name)
args = parser.parse_args()
for resolution in args.resolutions.split(","):
    for model in args.models.split(","):
        for mode in ("train", "inference"):
            print(timm_peer.ROW_PREFIX + json.dumps(dict(
                model=model, mode=mode, resolution=int(resolution), batch=int(args.batch),
                seconds_per_step={FAKE_PEER_SECONDS}, images_per_second=0.0,
                threads=int(args.threads), torch="stand-in", timm="stand-in")))
"""


# Slow (15 s of make test): test_benchmark_smoke's bench_model run steps the same configuration
# through the command line and test_model_benchmark_smoke_steps_every_layer_and_model_
# configuration checks its rows; the timm peer's rows are checked here, and by
# test_model_rows_take_the_best_round_and_divide_by_timm and
# test_timm_peer_failures_become_a_reason_not_an_error in make test.
@pytest.mark.slow
def test_model_benchmark_steps_every_layer_and_model_configuration(tmp_path):
    peer = fake_interpreter(tmp_path, STAND_IN_PEER)
    bench_model.main(["--size", "tiny", "--resolutions", "32", "--batch", "2", "--warmup", "1",
                      "--steps", "1", "--infer-steps", "1", "--layer-batch", "2",
                      "--layer-size", "8", "--layer-channels", "32", "--layer-repeats", "1",
                      # Untraced: tracing 10 graphs would take a minute on 2 cores.
                      "--eager", "--rounds", "1", "--timm-python", peer,
                      "--output-dir", str(tmp_path)])
    backend = keras.backend.backend()
    layers = check_results(tmp_path, f"layers_{backend}")
    check_layer_rows(layers)

    models = check_results(tmp_path, f"model_{backend}")
    variants = [bench_model.BASELINE, *bench_model.VARIANTS, *bench_model.TIMM_MODELS.values()]
    check_model_rows(models, variants)
    assert all(r["machine"]["backend"] == backend for r in models)
    assert all(r["gmacs"] > 0 for r in models if r["backend"] != "torch")
    # Every row carries its ratio to the peer's efficientnet_b0 (2 images / 0.25 s = 8 img/s).
    for row in models:
        assert row["timm_status"] == "measured"
        # Rows round the ratio to 4 decimals and images/s to 3: within half a unit of the
        # ratio's last place plus images/s's rounding over the peer's 8 img/s, whatever the
        # machine's speed (a relative bound fails when a slow machine makes the ratio small).
        assert row["ratio_to_timm"] == pytest.approx(
            row["images_per_second"] / (2 / FAKE_PEER_SECONDS), abs=5e-5 + 5e-4 / 8 + 1e-9)
    peer_rows = [r for r in models if r["backend"] == "torch"]
    assert {r["peer"]["threads"] for r in peer_rows} == {bench_model.intra_op_threads()}


def test_model_rows_take_the_best_round_and_divide_by_timm():
    samples = {
        ("train", 224, bench_model.BASELINE): {"backend": "tensorflow", "seconds": [2.0, 1.0]},
        ("train", 224, "G16-LN+PN"): {"backend": "tensorflow", "seconds": [0.8, 1.6],
                                      "gmacs": 0.64},
        ("train", 160, bench_model.BASELINE): {"backend": "tensorflow", "seconds": [0.5]},
        ("train", 160, "G16-LN+PN"): {"backend": "tensorflow", "seconds": [0.4]},
        ("train", 224, bench_model.TIMM_PEER): {"backend": "torch", "seconds": [1.25, 2.5]},
        ("train", 160, bench_model.TIMM_PEER): {"backend": "torch", "seconds": [0.625]},
    }
    rows = bench_model.model_rows(samples, batch=32, native=224, info=common.machine(),
                                  size="b0", eager=False, steps={"train": 3}, warmup=1,
                                  timm_status=None)
    by_key = {(r["resolution"], r["variant"]): r for r in rows}
    ours = by_key[224, "G16-LN+PN"]
    assert ours["images_per_second"] == 40.0  # the faster round: 32 images / 0.8 s
    assert ours["images_per_second_rounds"] == [20.0, 40.0] and ours["spread"] == 0.5
    assert ours["ratio_to_reference"] == 1.25  # keras.applications' best: 32 img/s
    assert ours["ratio_to_timm"] == 1.5625  # timm's best: 25.6 img/s
    half = by_key[160, "G16-LN+PN"]
    assert half["ratio_to_timm"] == 1.5625 and half["ratio_to_native_timm"] == 3.125
    assert half["ratio_to_native_reference"] == 2.5
    # Without the peer the rows say why, and carry no timm ratio.
    del samples["train", 224, bench_model.TIMM_PEER], samples["train", 160, bench_model.TIMM_PEER]
    rows = bench_model.model_rows(samples, batch=32, native=224, info=common.machine(),
                                  size="b0", eager=False, steps={"train": 3}, warmup=1,
                                  timm_status="no PyTorch peer: x does not exist")
    assert all("ratio_to_timm" not in r for r in rows)
    assert {r["timm_status"] for r in rows} == {"no PyTorch peer: x does not exist"}


def test_timm_peer_failures_become_a_reason_not_an_error(tmp_path):
    missing = tmp_path / "no-venv" / "python"
    measured, reason = bench_model.run_timm_peer(str(missing), [32], 2, threads=1, warmup=1,
                                                 steps=1, infer_steps=1)
    assert measured == [] and reason == (f"no PyTorch peer: {missing} does not exist "
                                         "(make venv-timm creates it)")
    # An environment where timm does not import (torchvision's CUDA build beside a CPU torch
    # fails like this): the child's own one-line reason comes back.
    broken = fake_interpreter(tmp_path, "import sys\nsys.modules['timm'] = None\n"
                                        "from benchmarks import timm_peer\n"
                                        "sys.exit(timm_peer.main(sys.argv[1:]))\n")
    measured, reason = bench_model.run_timm_peer(broken, [32], 2, threads=1, warmup=1,
                                                 steps=1, infer_steps=1)
    assert measured == []
    assert reason.startswith("import timm failed in ") and "import of timm halted" in reason
    crashing = fake_interpreter(tmp_path, "raise SystemExit('peer crashed: out of memory')\n")
    measured, reason = bench_model.run_timm_peer(crashing, [32], 2, threads=1, warmup=1,
                                                 steps=1, infer_steps=1)
    assert reason == "the timm peer exited with status 1: peer crashed: out of memory"


@pytest.mark.slow
@pytest.mark.skipif(not Path(bench_model.TIMM_PYTHON).is_file(),
                    reason="no .venv-timm (make venv-timm)")
def test_real_timm_peer_measures_both_models_in_both_modes():
    measured, reason = bench_model.run_timm_peer(bench_model.TIMM_PYTHON, [32], 2, threads=1,
                                                 warmup=1, steps=1, infer_steps=1)
    assert reason is None
    assert sorted((m["model"], m["mode"]) for m in measured) == sorted(
        (name, mode) for name in bench_model.TIMM_MODELS for mode in ("train", "inference"))
    assert all(m["images_per_second"] > 0 and m["threads"] == 1 for m in measured)


def test_model_benchmark_fails_loudly_on_a_non_finite_loss():
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(bench_model.CLASSES, kernel_initializer="zeros",
                                                 bias_initializer=keras.initializers.Constant(
                                                     np.nan))])
    with pytest.raises(common.NonFiniteLossError, match="non-finite loss nan"):
        bench_model._throughputs(model, "float32", 2, 4, warmup=1, steps=1, infer_steps=1)


# Slow: test_benchmark_smoke's bench_pipeline run takes these options through the command line
# and test_pipeline_benchmark_smoke_steps_every_configuration checks its rows.
@pytest.mark.slow
def test_pipeline_benchmark_steps_every_configuration(tmp_path):
    bench_pipeline.main(["--images", "4", "--image_sizes", "32", "--batch", "2",
                         "--seconds", "0.01", "--warmup_batches", "1", "--repeats", "1",
                         "--threads", "1", "--output-dir", str(tmp_path)])
    rows = check_results(tmp_path, "pipeline")
    check_pipeline_rows(rows)


def _run(args: list[str], python: str = sys.executable, **env) -> str:
    result = subprocess.run([python, *args], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_distribute_benchmark_steps_every_configuration(tmp_path):
    # Its own process: the logical CPU devices must be set before TensorFlow starts.
    _run(["-m", "benchmarks.bench_distribute", "--resolution", "32", "--batch", "2",
          "--global_batch", "4", "--micro_batches", "2", "--images", "24", "--warmup", "1",
          "--repeats", "1", "--output-dir", str(tmp_path)])
    rows = check_results(tmp_path, "distribute")
    assert [(r["benchmark"], r["variant"]) for r in rows] == [
        ("input_sharding", "1 worker"), ("input_sharding", "2 workers: worker 0"),
        ("input_sharding", "2 workers: worker 1"),
        ("data_parallel", "1 replica"), ("data_parallel", "2 replicas"),
        ("pipeline", "unsplit"), ("pipeline", "2 stages, 2 micro-batches")]
    check_references(rows, lambda r: r["benchmark"])
    # Each of 2 workers decodes half of the 24 photographs, counted at the decode op.
    sharding = rows[:3]
    assert [r["decoded_images"] for r in sharding] == [24, 12, 12]
    assert [r["decoded_share"] for r in sharding] == [1.0, 0.5, 0.5]


@pytest.mark.slow
def test_pareto_benchmark_trains_both_methods_one_tiny_step(tmp_path):
    from benchmarks import bench_pareto

    rows = bench_pareto.main(["--dataset", "synthetic", "--epochs", "1", "--updates-per-epoch",
                              "2", "--eval-steps", "1", "--finetune-epochs", "1",
                              "--train-resolution", "32", "--test-resolution", "32",
                              "--batch", "4", "--target", "0.0",
                              "--output-dir", str(tmp_path)])
    assert rows == check_results(tmp_path, "pareto")
    reference, ours = rows
    assert reference["variant"] == bench_pareto.BASELINE == ours["reference"]
    assert [p["phase"] for p in reference["curve"]] == ["train", "weight average"]
    assert [p["phase"] for p in ours["curve"]] == ["train", "fine-tuned (1 epochs, head only)"]
    assert ours["curve"][-1]["seconds"] > ours["curve"][0]["seconds"]  # fine-tune time counts
    assert reference["seconds_to_target"] == reference["curve"][0]["seconds"]


@pytest.mark.slow
def test_microbatch_benchmark_trains_each_norm_at_each_micro_batch(tmp_path):
    from benchmarks import bench_microbatch

    rows = bench_microbatch.main(["--dataset", "synthetic", "--norms", "BN", "LN+PN",
                                  "--micro-batches", "2", "4", "--global-batch", "4",
                                  "--epochs", "1", "--updates-per-epoch", "4", "--seeds", "0",
                                  "--device-iterations", "2", "--eval-steps", "2",
                                  "--bn-batches", "2", "--output-dir", str(tmp_path)])
    assert rows == check_results(tmp_path, "microbatch")
    assert sorted((r["variant"], r["batch"], r["gradient_accumulation"]) for r in rows) == [
        ("BN", 2, 2), ("BN", 4, 1), ("LN+PN", 2, 2), ("LN+PN", 4, 1)]
    assert all(r["reference"] == "BN micro-batch 4" and 0 <= r["top1"] <= 1 for r in rows)
    with pytest.raises(SystemExit):  # the reference must be among the runs
        bench_microbatch.main(["--norms", "LN", "--output-dir", str(tmp_path)])


JAX_PYTHON = REPO / ".venv-jax" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not JAX_PYTHON.exists(), reason="no .venv-jax (make install-jax)")
def test_gpu_benchmark_smoke_runs_under_jax_without_tensorflow(tmp_path):
    out = _run(["-m", "benchmarks.bench_gpu", "--smoke", "--variants", "G16-LN+PN",
                "--output-dir", str(tmp_path)], python=str(JAX_PYTHON), KERAS_BACKEND="jax")
    rows = [json.loads(line) for line in (tmp_path / "model_gpu_smoke.jsonl").read_text()
            .splitlines()]
    assert sorted((r["benchmark"], r["variant"], r["backend"]) for r in rows) == sorted(
        (mode, v, "jax") for mode in ("train", "inference")
        for v in (bench_model.BASELINE, "G16-LN+PN"))
    assert all(r["smoke"] and r["precision"] == "mixed_bfloat16" for r in rows)
    assert "timm peer skipped" in out or any(r["backend"] == "torch" for r in rows)
    # .venv-jax has no matplotlib: the chart is drawn here from the rows alone.
    charts.render(tmp_path / "model_gpu_smoke.jsonl")
    check_results(tmp_path, "model_gpu_smoke")
