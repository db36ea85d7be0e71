"""An EfficientNet of ours as OpenVINO IR (`.xml` + `.bin`), read from our ONNX export."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _convert(source, workdir: Path, **onnx_options):
    """`openvino.Model` of `source`: an `.onnx` path, an ONNX ModelProto, or a Keras model
    (exported to ONNX in `workdir` first)."""
    import openvino as ov

    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.suffix != ".onnx" or not path.is_file():
            raise ValueError(f"export_openvino: {source!s} is not an .onnx file")
        return ov.convert_model(str(path))
    onnx_path = workdir / "model.onnx"
    if hasattr(source, "SerializeToString"):  # an onnx.ModelProto
        onnx_path.write_bytes(source.SerializeToString())
    else:
        from keras_efficientnet.deploy.onnx_export import export_onnx

        export_onnx(source, onnx_path, **onnx_options)
    return ov.convert_model(str(onnx_path))


def openvino_model(source, **onnx_options):
    """The `openvino.Model` (in memory) of `source`: a Keras model, an ONNX ModelProto or an
    `.onnx` path; `onnx_options` go to `export_onnx` for a Keras model."""
    with tempfile.TemporaryDirectory(prefix="ke-openvino-") as workdir:
        return _convert(source, Path(workdir), **onnx_options)


def export_openvino(model_or_onnx, path: str | os.PathLike, *, compress_to_fp16: bool = False,
                    **onnx_options) -> Path:
    """Writes OpenVINO IR at `path` (`.xml`, with its `.bin` beside it) and returns the `.xml`
    path: `openvino.convert_model` of our ONNX export (`export_onnx`, the same graph: uint8
    NHWC images in, the model's output out), saved with float32 weights unless
    `compress_to_fp16`.

    Args:
        model_or_onnx: a built EfficientNet, an ONNX ModelProto or an `.onnx` file.
        path: the `.xml` file to write (".xml" is appended to a path without it).
        compress_to_fp16: store the weights in float16 (OpenVINO computes in float32 on a CPU
            either way). Default False: the float32 weights, the Keras model's outputs.
        onnx_options: `export_onnx`'s options (batch, opset, norm_form, image_size).
    """
    import openvino as ov

    path = Path(path)
    if path.suffix != ".xml":
        path = path.with_name(path.name + ".xml")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as workdir:
        model = _convert(model_or_onnx, Path(workdir), **onnx_options)
        # Written beside, then renamed: a reader never sees an .xml without its .bin.
        staged = Path(workdir) / path.name
        ov.save_model(model, str(staged), compress_to_fp16=compress_to_fp16)
        os.replace(staged.with_suffix(".bin"), path.with_suffix(".bin"))
        os.replace(staged, path)
    return path
