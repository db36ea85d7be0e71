"""The deployment benchmark's own arithmetic: MACs counted on an ONNX graph (by hand), the
recipe model it reads from the flagfile, issue 33's targets, and rows with ratio_to_timm."""

import pytest

onnx = pytest.importorskip("onnx", reason="onnx not installed (pip install -e \".[deploy]\")")

from benchmarks import bench_deploy  # noqa: E402 (needs the deploy extra's modules)

pytestmark = pytest.mark.tf_only


def _graph(path):
    """images [N,8,10,10] -> Conv(16, 3x3, groups 2, stride 2, pad 1) -> [N,16,5,5] ->
    Conv(16, 1x1) -> GlobalAveragePool -> Flatten -> Gemm(16 -> 4)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in (
        ("w1", (16, 4, 3, 3)), ("w2", (16, 16, 1, 1)), ("fc", (16, 4)), ("b", (4,)))]
    nodes = [
        helper.make_node("Conv", ["images", "w1"], ["a"], group=2, strides=[2, 2],
                         pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Conv", ["a", "w2"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "b"], ["logits"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                   ["batch", 8, 10, 10])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_graph_macs_by_hand(tmp_path):
    macs, nodes = bench_deploy.graph_macs(_graph(tmp_path / "g.onnx"))
    # Grouped 3x3: 16 x 5 x 5 outputs x (8 / 2 input channels x 9); 1x1: 16 x 25 x 16;
    # Gemm: 4 outputs x 16.
    assert macs == 16 * 25 * 4 * 9 + 16 * 25 * 16 + 4 * 16
    assert nodes == 5


def test_the_recipe_model_comes_from_its_flagfile():
    assert bench_deploy.recipe_model() == ("efficientnet-tiny-g1-bn", 40)


def test_issue_33_targets():
    # G16-LN+PN: images/s at least timm's x timm's MACs / ours; latency at most the inverse.
    text, bound = bench_deploy.target_for("G16-LN+PN B0", "deploy_throughput", "openvino",
                                          0.64, 0.39)
    assert bound == pytest.approx(0.39 / 0.64) and "MAC ratio" in text
    _, bound = bench_deploy.target_for("G16-LN+PN B0", "deploy_latency", "onnxruntime", 0.64,
                                       0.39)
    assert bound == pytest.approx(0.64 / 0.39)
    assert bench_deploy.target_for("G1-BN B0", "deploy_throughput", "openvino", 0.39,
                                   0.39)[1] == 1.0
    # No target on TensorFlow, for G16-GN, for G1-BN's latency, or without timm.
    assert bench_deploy.target_for("G16-LN+PN B0", "deploy_throughput", "tensorflow", 0.64,
                                   0.39) is None
    assert bench_deploy.target_for("G16-GN B0", "deploy_throughput", "openvino", 0.64,
                                   0.39) is None
    assert bench_deploy.target_for("G1-BN B0", "deploy_latency", "openvino", 0.39, 0.39) is None
    assert bench_deploy.target_for("G1-BN B0", "deploy_throughput", "openvino", 0.39,
                                   None) is None


def test_rows_hold_ratios_to_timm_on_the_same_runtime_and_the_targets():
    import argparse

    args = argparse.Namespace(batch=4, batches=2, repeats=2, latency_calls=3, size="b0")
    entries = {"G16-LN+PN B0": {"nodes": 300, "gmacs": 0.8, "resolution": 224},
               bench_deploy.TIMM: {"nodes": 298, "gmacs": 0.4, "resolution": 224}}
    # (seconds a batch of 4, batch-1 seconds) per round.
    samples = {("G16-LN+PN B0", "openvino", "default"): [(0.4, 0.02), (0.5, 0.03)],
               (bench_deploy.TIMM, "openvino", "default"): [(0.1, 0.01)],
               ("G16-LN+PN B0", "tensorflow", "default"): [(0.8, 0.05)],
               (bench_deploy.TIMM, "torch", "default"): [(0.2, 0.02)]}
    rows = {(r["benchmark"], r["variant"], r["backend"]): r for r in bench_deploy.build_rows(
        samples, entries, args, {"cpu": "test", "cores": 2}, 2, None)}
    ours = rows[("deploy_throughput", "G16-LN+PN B0", "openvino")]
    assert ours["images_per_second"] == 10.0 and ours["images_per_second_rounds"] == [8.0,
                                                                                     10.0]
    assert ours["spread"] == 0.2 and ours["ratio_to_timm"] == 0.25
    assert ours["mac_rate_ratio_to_timm"] == 0.5 and ours["gmacs_per_second"] == 8.0
    assert ours["target_bound"] == 0.5 and ours["target_met"] is False
    latency = rows[("deploy_latency", "G16-LN+PN B0", "openvino")]
    assert latency["latency_ms"] == 20.0 and latency["latency_ratio_to_timm"] == 2.0
    assert latency["target_bound"] == 2.0 and latency["target_met"] is True
    # TensorFlow's rows against PyTorch eager; every row has its ratio to timm.
    assert rows[("deploy_throughput", "G16-LN+PN B0", "tensorflow")]["ratio_to_timm"] == 0.25
    assert all("ratio_to_timm" in row for row in rows.values())


def test_int8_rows_are_against_timms_float32_and_their_own_float32():
    import argparse

    args = argparse.Namespace(batch=4, batches=2, repeats=2, latency_calls=3, size="b0")
    entries = {"G16-LN+PN B0": {"nodes": 300, "gmacs": 0.8, "resolution": 224},
               "G16-LN+PN B0 int8": {"nodes": 700, "gmacs": 0.8, "resolution": 224,
                                     "variant": "G16-LN+PN B0", "precision": "int8"},
               bench_deploy.TIMM: {"nodes": 298, "gmacs": 0.4, "resolution": 224}}
    samples = {("G16-LN+PN B0", "openvino", "default"): [(0.4, 0.02)],
               ("G16-LN+PN B0 int8", "openvino", "default"): [(0.16, 0.01)],
               ("G16-LN+PN B0 int8", "onnxruntime", "default"): [(0.5, 0.04)],
               (bench_deploy.TIMM, "openvino", "default"): [(0.2, 0.01)],
               (bench_deploy.TIMM, "onnxruntime", "default"): [(0.25, 0.02)]}
    rows = {(r["benchmark"], r["variant"], r["backend"], r["precision"]): r
            for r in bench_deploy.build_rows(samples, entries, args, {"cpu": "test", "cores": 2}, 2,
                                           None)}
    int8 = rows[("deploy_throughput", "G16-LN+PN B0", "openvino", "int8")]
    # 25 images/s against timm's float32 20 and our float32 10.
    assert int8["images_per_second"] == 25.0 and int8["ratio_to_timm"] == 1.25
    assert int8["ratio_to_float32"] == 2.5
    assert int8["target"] == "int8 images/s >= timm's float32" and int8["target_met"] is True
    assert int8["reference"] == f"{bench_deploy.TIMM} on OpenVINO"
    # On ONNX Runtime: the ratio, no target; no float32 row there, so no ratio_to_float32.
    other = rows[("deploy_throughput", "G16-LN+PN B0", "onnxruntime", "int8")]
    assert other["ratio_to_timm"] == 0.5 and "target" not in other
    assert "ratio_to_float32" not in other
    assert bench_deploy.target_for("G16-LN+PN B0", "deploy_latency", "openvino", 0.8, 0.4,
                                   "int8") is None


def test_the_readme_table_shows_timm_first_and_ratios_at_timms_resolution():
    import argparse

    args = argparse.Namespace(batch=4, batches=2, repeats=2, latency_calls=3, size="b0")
    entries = {"G16-LN+PN B0": {"nodes": 300, "gmacs": 0.8, "resolution": 224},
               "tiny": {"nodes": 100, "gmacs": 0.01, "resolution": 40},
               bench_deploy.TIMM: {"nodes": 298, "gmacs": 0.4, "resolution": 224}}
    samples = {}
    for runtime in bench_deploy.DEPLOY_RUNTIMES:
        samples[("G16-LN+PN B0", runtime, "default")] = [(0.4, 0.02)]
        samples[("tiny", runtime, "default")] = [(0.004, 0.001)]
        samples[(bench_deploy.TIMM, runtime, "default")] = [(0.2, 0.01)]
    samples[("G16-LN+PN B0", "onnxruntime", "1 thread")] = [(0.1, 0.01)]  # not in the table
    rows = bench_deploy.build_rows(samples, entries, args, {"cpu": "test", "cores": 2}, 2,
                                   None)
    lines = bench_deploy.readme_table(rows).splitlines()
    assert lines[0] == ("| model | ONNX Runtime, batch 4, images/s | OpenVINO, batch 4, "
                        "images/s | ONNX Runtime, batch 1 | OpenVINO, batch 1 |")
    assert lines[2] == "| timm efficientnet_b0, 224 px | 20.0 | 20.0 | 10 ms | 10 ms |"
    # 10 images/s against timm's 20: 0.5x; 20 ms against 10 ms: a latency 2x timm's.
    assert lines[3] == ("| G16-LN+PN B0, 224 px | 10.0 (0.50x) | 10.0 (0.50x) | 20 ms (2.00x) "
                        "| 20 ms (2.00x) |")
    assert lines[4] == "| tiny, 40 px | 1000.0 | 1000.0 | 1 ms | 1 ms |"
    assert len(lines) == 5
