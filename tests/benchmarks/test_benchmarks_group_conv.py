"""The oneDNN off/on group-conv benchmark: its arithmetic by hand, and one tiny run (slow)."""

import argparse

import pytest

from benchmarks import bench_group_conv, common
from tests.benchmarks.test_benchmarks_harness import PNG_MAGIC, check_references, check_results


def test_forward_macs_by_hand():
    # 14x14 outputs, 3x3 taps, batch 2, 320 channels: a dense conv reads all 320 inputs per
    # output, the G16 conv 16, the depthwise conv 1.
    assert bench_group_conv.forward_macs("dense", 2, 14, 320, 3) == 2 * 196 * 9 * 320 * 320
    assert bench_group_conv.forward_macs("group", 2, 14, 320, 3) == 2 * 196 * 9 * 16 * 320
    assert bench_group_conv.forward_macs("depthwise", 2, 14, 320, 3) == 2 * 196 * 9 * 320


def _measured(seconds_scale: float) -> list[dict]:
    convs = [{"benchmark": "conv_fwd_bwd", "kind": kind, "side": 14, "channels": 320,
              "kernel": 3, "seconds": seconds * seconds_scale, "path": path,
              "macs": 3 * bench_group_conv.forward_macs(kind, 4, 14, 320, 3)}
             for kind, seconds, path in (("dense", 0.4, ""), ("group", 0.05, "per_group"),
                                         ("depthwise", 0.01, ""))]
    models = [{"benchmark": "train_onednn", "variant": "G16-LN+PN",
               "seconds": 2.0 * seconds_scale, "images_per_second": 16 / seconds_scale}]
    return convs + models


def test_rows_give_gmacs_and_ratios_to_the_dense_conv_and_to_onednn_on(tmp_path):
    args = argparse.Namespace(batch=4, resolution=224, model_batch=32, steps=3, infer_steps=3,
                              warmup=2, repeats=3, model_size="b0", eager=False)
    info = common.machine()
    rows = bench_group_conv.make_rows({"off": _measured(2.0), "on": _measured(1.0)}, args, info)
    group_off = next(r for r in rows if r["onednn"] == "off" and r["path"] == "per_group")
    # 3 x (4 * 196 * 9 * 16 * 320) MACs in 0.1 s; the dense conv: 20x the MACs in 0.8 s.
    macs = 3 * 4 * 196 * 9 * 16 * 320
    assert group_off["gmacs_per_second"] == pytest.approx(macs / 0.1 / 1e9, rel=1e-3)
    assert group_off["ratio_gmacs_to_dense"] == pytest.approx((macs / 0.1) / (20 * macs / 0.8),
                                                              rel=1e-3)
    assert group_off["variant"] == "GroupConv2D(group_size=16) [per_group]"
    check_references([r for r in rows if r["benchmark"] == "conv_fwd_bwd"],
                     lambda r: (r["onednn"], r["resolution"], r["channels"]))
    train_off = next(r for r in rows if r["benchmark"] == "train_onednn" and r["onednn"] == "off")
    # Twice the seconds with oneDNN off: half the images/s of the same model with it on.
    assert train_off["reference"] == "G16-LN+PN (oneDNN on)"
    assert train_off["ratio_to_reference"] == pytest.approx(0.5)
    path, chart = common.write_results("onednn", rows, tmp_path)
    assert chart.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_benchmark_runs_both_settings_in_child_processes(tmp_path):
    bench_group_conv.main(["--batch", "1", "--repeats", "1", "--resolution", "64",
                           "--model-batch", "4", "--warmup", "1", "--steps", "1",
                           "--infer-steps", "1", "--output-dir", str(tmp_path)])
    rows = check_results(tmp_path, "onednn_tensorflow")
    paths = {(r["onednn"], r["channels"]): r["path"] for r in rows
             if r["benchmark"] == "conv_fwd_bwd" and r["variant"].startswith("GroupConv2D")}
    assert {path for (setting, _), path in paths.items() if setting == "off"} == {"per_group"}
    assert paths["on", 768] == "grouped"  # 48 groups, oneDNN's grouped gradient
    assert {(r["benchmark"], r["onednn"]) for r in rows} >= {
        ("train_onednn", "off"), ("train_onednn", "on"), ("conv_fwd_bwd", "off")}
