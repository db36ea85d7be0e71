"""Deployment: an EfficientNet exported for CPU runtimes (ONNX, OpenVINO IR) and int8.

Needs the `deploy` extra (`pip install 'keras-efficientnet[deploy]'`: onnx, onnxruntime,
openvino, nncf); nothing in the model, layers or trainer imports this package. Names load on
first use (`keras_efficientnet.lazy`), so importing the face imports no runtime.
"""

from keras_efficientnet.lazy import lazy_face

_EXPORTS = {
    "export_onnx": (".onnx_export", "export_onnx"),
    "onnx_model": (".onnx_export", "onnx_model"),
    "export_openvino": (".openvino_export", "export_openvino"),
    "calibration_images": (".int8", "calibration_images"),
    "quantize_onnx": (".int8", "quantize_onnx"),
    "quantize_openvino": (".int8", "quantize_openvino"),
}

__all__ = [*_EXPORTS]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, submodules=(
    "onnx_export", "openvino_export", "int8"))
