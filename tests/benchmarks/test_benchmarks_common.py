"""Benchmark plumbing: the shared row schema, result files, non-finite checks and charts."""

import json
import math

import pytest

from benchmarks import charts, common

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MACHINE = {"cpu": "test cpu", "cores": 2, "load_average_1m": 0.5, "keras": "3"}


def row(benchmark="train", variant="ours", reference="ref", ips=50.0, ref_ips=100.0, **extra):
    return common.make_row(benchmark, machine=MACHINE, backend="tensorflow", variant=variant,
                           resolution=32, batch=4, precision="float32", images_per_second=ips,
                           reference=reference, reference_images_per_second=ref_ips, **extra)


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_a_row_carries_every_schema_field_and_its_ratio():
    made = row(extra_field=7)
    assert set(common.ROW_SCHEMA) <= set(made)
    assert made["ratio_to_reference"] == 0.5 and made["extra_field"] == 7
    common.validate_row(json.loads(json.dumps(made)))  # survives a round trip through JSON


@pytest.mark.parametrize("change,match", [
    (lambda r: r.pop("machine"), "lacks 'machine'"),
    (lambda r: r.update(batch="4"), "'batch' must be"),
    (lambda r: r.update(resolution=True), "'resolution' must be"),
    (lambda r: r.update(images_per_second=math.nan), "finite and > 0"),
    (lambda r: r.update(ratio_to_reference=0.0), "finite and > 0"),
    (lambda r: r.update(machine={"gpu": "x"}), "must name cpu and cores"),
])
def test_rows_off_the_schema_are_refused(change, match):
    bad = row()
    change(bad)
    with pytest.raises(ValueError, match=match):
        common.validate_row(bad)


def latency_row(**changes):
    made = {"benchmark": "command_latency", "machine": MACHINE, "backend": "tensorflow",
            "variant": "error: --recipe=nosuch", "latency_seconds": 0.5,
            "reference": "python -c 'import tensorflow'", "ratio_to_reference": 0.05}
    made.update(changes)
    return made


@pytest.mark.parametrize("change,match", [
    (lambda r: r.pop("variant"), "lacks 'variant'"),
    (lambda r: r.update(latency_seconds=0.0), "'latency_seconds' must be finite and > 0"),
    (lambda r: r.update(ratio_to_reference=math.inf), "finite and > 0"),
    (lambda r: r.update(machine={}), "must name cpu and cores"),
])
def test_latency_rows_carry_seconds_instead_of_a_rate(change, match):
    common.validate_row(latency_row())  # no images_per_second, resolution or batch
    bad = latency_row()
    change(bad)
    with pytest.raises(ValueError, match=match):
        common.validate_row(bad)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_stops_the_benchmark(value):
    with pytest.raises(common.NonFiniteLossError, match="non-finite loss .* G16 training"):
        common.check_finite(value, "G16 training")
    assert common.check_finite(1.5, "fine") == 1.5


def test_results_go_where_they_are_told(tmp_path, monkeypatch):
    monkeypatch.setenv(common.RESULTS_ENV, str(tmp_path / "env"))
    assert common.results_dir() == tmp_path / "env"
    assert common.results_dir(tmp_path / "arg") == tmp_path / "arg"
    path = common.write_rows("demo", [row(), row(variant="ref")])
    assert path == tmp_path / "env" / "demo.jsonl"
    assert [r["variant"] for r in common.read_rows(path)] == ["ours", "ref"]
    assert not list(path.parent.glob("*.tmp"))


def _pareto_row(variant, reference, phases):
    curve = [{"phase": phase, "epoch": i + 1, "seconds": 10.0 * (i + 1), "top1": 0.5 + 0.1 * i}
             for i, phase in enumerate(phases)]
    return row("pareto", variant=variant, reference=reference, curve=curve, target_top1=0.6,
               seconds_to_target=20.0, dataset="digits", test_resolution=96)


CHART_ROWS = {
    "model": [row("train", variant="ref", ips=100.0), row("train"),
              row("inference", variant="ref", ips=300.0, ref_ips=300.0),
              row("inference", ref_ips=300.0)],
    "layers": [row("layer_fwd_bwd", variant="ref", ips=100.0, channels=32),
               row("layer_fwd_bwd", ips=1.0, channels=32),  # 100x slower: a log axis
               row("norm_fwd_bwd", variant="ref", ips=100.0, channels=32)],
    "pipeline": [dict(row("host_pipeline", variant="ref", ips=100.0), resolution=None),
                 row("host_pipeline", bytes_per_image=3072)],
    "distribute": [row("data_parallel", variant="ref", ips=100.0), row("pipeline")],
    "pareto": [_pareto_row("ref", "ref", ["train", "train", "weight average"]),
               _pareto_row("ours", "ref", ["train", "fine-tuned"])],
}


@pytest.mark.parametrize("kind", sorted(CHART_ROWS))
def test_each_result_file_gets_its_png_chart(tmp_path, kind):
    path, chart = common.write_results(kind, CHART_ROWS[kind], tmp_path)
    assert path == tmp_path / f"{kind}.jsonl" and chart == tmp_path / f"{kind}.png"
    assert_png(chart)


def test_a_file_of_unknown_benchmarks_has_no_chart(tmp_path):
    path = common.write_rows("odd", [row("something_else")], tmp_path)
    with pytest.raises(ValueError, match="no chart for the benchmarks"):
        charts.render(path)
