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


def test_model_benchmark_steps_every_layer_and_model_configuration(tmp_path):
    bench_model.main(["--size", "tiny", "--resolutions", "32", "--batch", "2", "--warmup", "1",
                      "--steps", "1", "--infer-steps", "1", "--layer-batch", "2",
                      "--layer-size", "8", "--layer-channels", "32", "--layer-repeats", "1",
                      # Untraced: tracing 10 graphs would take a minute on 2 cores.
                      "--eager", "--output-dir", str(tmp_path)])
    backend = keras.backend.backend()
    layers = check_results(tmp_path, f"layers_{backend}")
    assert {(r["benchmark"], r["variant"]) for r in layers} == {
        ("layer_fwd_bwd", "DepthwiseConv2D"), ("layer_fwd_bwd", "GroupConv2D(group_size=16)"),
        ("layer_fwd_bwd", "keras Conv2D(groups=2)"), ("norm_fwd_bwd", "GroupNorm(4)+swish"),
        ("norm_fwd_bwd", "LayerNorm+swish"), ("norm_fwd_bwd", "GroupNorm(4)+ProxyNorm(swish)"),
        ("norm_fwd_bwd", "LayerNorm+ProxyNorm(swish)")}
    check_references(layers, lambda r: r["benchmark"])

    models = check_results(tmp_path, f"model_{backend}")
    variants = [bench_model.BASELINE, *bench_model.VARIANTS]
    assert sorted((r["benchmark"], r["variant"]) for r in models) == sorted(
        (mode, v) for mode in ("train", "inference") for v in variants)
    assert {(r["resolution"], r["batch"], r["precision"]) for r in models} == {
        (32, 2, "float32")}
    check_references(models, lambda r: (r["benchmark"], r["resolution"]))
    assert all(r["gmacs"] > 0 and r["machine"]["backend"] == backend for r in models)


def test_model_benchmark_fails_loudly_on_a_non_finite_loss():
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(bench_model.CLASSES, kernel_initializer="zeros",
                                                 bias_initializer=keras.initializers.Constant(
                                                     np.nan))])
    with pytest.raises(common.NonFiniteLossError, match="non-finite loss nan"):
        bench_model._throughputs(model, "float32", 2, 4, warmup=1, steps=1, infer_steps=1)


def test_pipeline_benchmark_steps_every_configuration(tmp_path):
    bench_pipeline.main(["--images", "4", "--image_sizes", "32", "--batch", "2",
                         "--seconds", "0.01", "--warmup_batches", "1", "--repeats", "1",
                         "--threads", "1", "--output-dir", str(tmp_path)])
    rows = check_results(tmp_path, "pipeline")
    assert {(r["variant"], r["resolution"]) for r in rows} == {
        ("decode_and_crop_ceiling", None), ("uint8_pipeline", 32), ("float32_pipeline", 32),
        ("uint8_unguarded", 32), ("float32_unguarded", 32)}
    check_references(rows, lambda r: r["benchmark"])
    sent = {r["variant"]: r["bytes_per_image"] for r in rows}
    assert sent["uint8_unguarded"] == 32 * 32 * 3 and sent["float32_unguarded"] == 4 * 32 * 32 * 3


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

    rows = bench_pareto.main(["--dataset", "synthetic", "--epochs", "1", "--steps-per-epoch",
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
                                  "--epochs", "1", "--steps-per-epoch", "4", "--seeds", "0",
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
