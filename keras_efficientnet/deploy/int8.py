"""int8 post-training quantization of our exports, calibrated on a few hundred training images.

Two routes, one per runtime: OpenVINO's NNCF (`nncf.quantize` of the OpenVINO model: int8
convolutions and matrix products, the rest float) and ONNX Runtime's static quantizer
(`onnxruntime.quantization.quantize_static`, QDQ format, per-channel int8 weights, uint8
activations). Both see the same float graph (`export_onnx`) and the same calibration images:
uint8 `[n, height, width, 3]`, as the exported graph takes them (`calibration_images` reads a
dataset source the trainer reads).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

# Images a calibration reads by default: NNCF's default subset is 300 too.
CALIBRATION_IMAGES = 300
# Images per calibration batch fed to the quantizers.
CALIBRATION_BATCH = 16


def calibration_images(source: str, image_size: int, count: int = CALIBRATION_IMAGES, *,
                       split: str = "train", data_dir: str | None = None,
                       resize_ratio: float | None = None, seed: int = 0) -> np.ndarray:
    """`count` images of `split` of `source` (the trainer's dataset syntax: `digits`,
    `fashion_mnist`, `folder:PATH` ...) as uint8 `[count, image_size, image_size, 3]`, read
    as evaluation reads them (short side resized to `image_size * resize_ratio`, centre crop;
    `resize_ratio` None: the pipeline's default), from a shuffled order (`seed`) so that every
    class is seen. Fewer where the split holds fewer; a ValueError where it holds none."""
    from keras_efficientnet import datasets

    fields = {} if resize_ratio is None else {"eval_resize_ratio": float(resize_ratio)}
    options = datasets.InputOptions(
        source=source, split=split, image_size=int(image_size), batch_size=CALIBRATION_BATCH,
        training=False, augment=False, mix=False, repeat=False, data_dir=data_dir, seed=seed,
        **fields)
    batches, total = [], 0
    for images, _ in datasets.make_dataset(options):
        batches.append(np.asarray(images, dtype="uint8"))
        total += len(batches[-1])
        if total >= count:
            break
    if not total:
        raise ValueError(f"calibration: {source} ({split}) gave no images")
    return np.concatenate(batches)[:count]


def _batches(images: np.ndarray, batch: int = CALIBRATION_BATCH) -> list[np.ndarray]:
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3 or not len(images):
        raise ValueError(f"calibration images must be uint8 [n, height, width, 3], n >= 1; "
                         f"received {images.dtype} {images.shape}")
    return [images[i:i + batch] for i in range(0, len(images), batch)]


def _onnx_file(source, workdir: Path, **onnx_options) -> Path:
    """`source` (a Keras model, an ONNX ModelProto or an `.onnx` path) as an `.onnx` file."""
    if isinstance(source, (str, os.PathLike)):
        return Path(source)
    path = workdir / "float.onnx"
    if hasattr(source, "SerializeToString"):
        path.write_bytes(source.SerializeToString())
        return path
    from keras_efficientnet.deploy.onnx_export import export_onnx

    return export_onnx(source, path, **onnx_options)


def quantize_openvino(source, path: str | os.PathLike, calibration: np.ndarray,
                      **onnx_options) -> Path:
    """Writes an int8 OpenVINO IR of `source` (a Keras model, an ONNX ModelProto or an `.onnx`
    file) at `path` (".xml" appended where missing; its `.bin` beside it), quantized by NNCF
    with `calibration` (uint8 images `[n, height, width, 3]`, e.g. `calibration_images`).
    Returns the `.xml` path."""
    import nncf
    import openvino as ov

    path = Path(path)
    if path.suffix != ".xml":
        path = path.with_name(path.name + ".xml")
    batches = _batches(calibration)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as workdir:
        model = ov.convert_model(str(_onnx_file(source, Path(workdir), **onnx_options)))
        # subset_size counts the dataset's items, our batches: all of them.
        quantized = nncf.quantize(model, nncf.Dataset(batches), subset_size=len(batches))
        staged = Path(workdir) / path.name
        ov.save_model(quantized, str(staged), compress_to_fp16=False)
        os.replace(staged.with_suffix(".bin"), path.with_suffix(".bin"))
        os.replace(staged, path)
    return path


def quantize_onnx(source, path: str | os.PathLike, calibration: np.ndarray,
                  **onnx_options) -> Path:
    """Writes an int8 ONNX file of `source` (a Keras model, an ONNX ModelProto or an `.onnx`
    file) at `path`: ONNX Runtime's static quantizer, QDQ format (runs on any runtime that
    reads QuantizeLinear / DequantizeLinear), int8 weights per output channel and uint8
    activations, ranges from `calibration` (uint8 images `[n, height, width, 3]`). Only the
    convolutions are quantized: the norms, activations, pooling and classifier stay float.
    Returns the path."""
    from onnxruntime import quantization

    batches = _batches(calibration)

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.rest = iter(batches)

        def get_next(self):
            batch = next(self.rest, None)
            return None if batch is None else {"images": batch}

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as workdir:
        float_path = _onnx_file(source, Path(workdir), **onnx_options)
        staged = Path(workdir) / "int8.onnx"
        quantization.quantize_static(
            str(float_path), str(staged), Reader(), quant_format=quantization.QuantFormat.QDQ,
            per_channel=True, activation_type=quantization.QuantType.QUInt8,
            weight_type=quantization.QuantType.QInt8,
            calibrate_method=quantization.CalibrationMethod.MinMax,
            # The convolutions (all but a few thousandths of the MACs) and nothing else: by
            # default the quantizer also rounds the softmax's probabilities to 1/255 steps.
            op_types_to_quantize=["Conv"])
        os.replace(staged, path)
    return path
