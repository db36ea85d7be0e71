"""export_openvino: OpenVINO IR of our ONNX graph, run on OpenVINO's CPU plugin, against
Keras' own layers."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx", reason="onnx is not installed (the `deploy` extra)")
ov = pytest.importorskip("openvino", reason="openvino is not installed (the `deploy` extra)")

from keras_efficientnet.deploy import export_openvino  # noqa: E402
from tests.deploy.models_for_export import (  # noqa: E402
    assert_close,
    images,
    keras_outputs,
    perturbed,
)


@pytest.mark.parametrize("preset", [
    "efficientnet-tiny-g1-bn", pytest.param("efficientnet-tiny-g16-gn", marks=pytest.mark.slow),
    "efficientnet-tiny-g16-lnpn"])
def test_openvino_outputs_equal_keras_layers(preset, tmp_path):
    model = perturbed(preset)
    path = export_openvino(model, tmp_path / "model")
    assert path.name == "model.xml" and path.with_suffix(".bin").is_file()
    # float32: OpenVINO's CPU plugin computes in bfloat16 by default where the CPU has it
    # (this project's AMD EPYC does), 0.5% off.
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = images()
    expected = keras_outputs(model, x)
    assert_close(compiled(x)[0], expected)
    assert_close(compiled(x[:1])[0], expected[:1])  # the dynamic batch


def test_openvino_refuses_a_path_that_is_not_onnx(tmp_path):
    (tmp_path / "model.txt").write_text("not onnx")
    with pytest.raises(ValueError, match="not an .onnx file"):
        export_openvino(tmp_path / "model.txt", tmp_path / "out.xml")
