"""int8 post-training quantization: the calibration images, and each quantizer's graph against
the float export it starts from."""

from __future__ import annotations

import collections

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is not installed (the `deploy` extra)")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the `deploy` "
                          "extra)")

from keras_efficientnet.deploy import int8, onnx_export  # noqa: E402
from tests.deploy.models_for_export import perturbed  # noqa: E402

SIZE = 32


@pytest.fixture(scope="module")
def calibration():
    return int8.calibration_images("digits", SIZE, 48)


@pytest.fixture(scope="module")
def model():
    return perturbed("efficientnet-tiny-g16-lnpn", resolution=SIZE, seed=3)


def test_calibration_images_are_uint8_at_the_models_size_from_several_classes(calibration):
    assert calibration.shape == (48, SIZE, SIZE, 3) and calibration.dtype == np.uint8
    # Digits are white strokes on black: each image has both, and the images differ.
    assert calibration.min() == 0 and calibration.max() > 200
    assert len({image.tobytes() for image in calibration}) == 48
    with pytest.raises(ValueError, match="uint8"):
        int8.quantize_onnx(None, "unused.onnx", calibration.astype("float32"))


def _run(path_or_proto, x):
    data = path_or_proto if isinstance(path_or_proto, (str, bytes)) else str(path_or_proto)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, {"images": x})[0]


def test_onnx_int8_quantizes_the_convolutions_and_keeps_the_float_outputs(
        model, calibration, tmp_path):
    path = int8.quantize_onnx(model, tmp_path / "int8.onnx", calibration)
    graph = onnx.load(str(path)).graph
    counts = collections.Counter(node.op_type for node in graph.node)
    weights = {init.name: init for init in graph.initializer}
    # Every Conv reads dequantized int8 weights (per output channel: one scale per filter).
    conv_weights = [node.input[1] for node in graph.node if node.op_type == "Conv"]
    dequantize = {node.output[0]: node for node in graph.node
                  if node.op_type == "DequantizeLinear"}
    assert len(conv_weights) == counts["Conv"] == 36
    for name in conv_weights:
        source = weights[dequantize[name].input[0]]
        assert source.data_type == onnx.TensorProto.INT8
        scales = onnx.numpy_helper.to_array(weights[dequantize[name].input[1]])
        assert scales.size == source.dims[0]
    assert counts["LayerNormalization"] == 22  # the norms stay float
    assert_near_float(_run(path, calibration), model, calibration)


def assert_near_float(actual, model, x) -> None:
    """int8 outputs near the float export's. A random network amplifies rounding (its
    activations' ranges are not a trained one's): on this one the probabilities move by 0.02-
    0.03 on average and 10-20% of the top-1 classes change (docs/deploy.md has a trained
    model's accuracy); wrong scales or zero points would leave top-1 near chance, 0.1-0.2."""
    expected = _run(onnx_export.onnx_model(model).SerializeToString(), x)
    assert np.abs(actual - expected).mean() < 0.05
    assert (actual.argmax(1) == expected.argmax(1)).mean() >= 0.7


@pytest.mark.slow
def test_openvino_int8_runs_int8_convolutions(model, calibration, tmp_path):
    ov = pytest.importorskip("openvino", reason="openvino is not installed")
    pytest.importorskip("nncf", reason="nncf is not installed (the `deploy` extra)")
    path = int8.quantize_openvino(model, tmp_path / "int8", calibration)
    assert path.name == "int8.xml" and path.with_suffix(".bin").is_file()
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    actual = compiled(calibration)[0]
    runtime = compiled.get_runtime_model()
    precisions = collections.Counter(
        node.get_rt_info()["runtimePrecision"].astype(str).lower() for node in runtime.get_ops()
        if node.get_rt_info()["layerType"].astype(str) == "Convolution")
    assert precisions["i8"] + precisions["u8"] == 36, precisions  # every conv
    assert_near_float(actual, model, calibration)
