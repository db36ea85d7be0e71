"""Runs an exported EfficientNet on a CPU runtime: which runtimes are installed, and one callable
per loaded model that takes uint8 images and returns class probabilities as NumPy.

Three runtimes, each reading its own artifact (`keras_efficientnet.deploy`'s exports):

- `openvino`: an OpenVINO IR (`.xml`, its `.bin` beside it) or an ONNX file, compiled for the
  CPU with the LATENCY performance hint (one stream on every core, one request per call); the
  model is reshaped to each batch size it meets and compiled once per size (a static shape).
  THROUGHPUT (one stream per core, the batch split across them) measured mixed on a loaded
  2-core machine (faster for G16-LN+PN at batch 32, slower for timm's B0 and at batch 1:
  benchmarks/README.md, "Deployment"), so the hint stays LATENCY; `hint=` chooses.
- `onnxruntime`: an ONNX file in an `InferenceSession` on the CPUExecutionProvider with every
  graph optimization and one intra-op thread per core (`threads=`; on an oversubscribed machine
  1 thread measured faster, see the same section).
- `tensorflow`: a SavedModel folder (its `serving_default` signature), as TensorFlow Serving
  runs it; the reference the others are checked against.

`RUNTIMES` is the order `auto` tries (the predict command's `--runtime=auto`): OpenVINO, ONNX
Runtime, TensorFlow, the order issue 33 measured on a quiet 2-core AMD EPYC for timm's B0 and our
G1-BN (OpenVINO about 1.7x ONNX Runtime). On the same CPU shared 6-8 times over, `make
benchmark-deploy` found TensorFlow's predict fastest for our B0s: the runtimes' thread pools
lose their time slices there. Every session takes `[batch, height, width, 3]` uint8 images (the
serving signature's contract) and returns float32 probabilities `[batch, classes]`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from keras_efficientnet.atomic import check_directory, fsync_directory

# NumPy is imported where it is used: the predict command imports this module to parse its
# flags, before anything heavy loads (its usage errors come in well under a second).
if TYPE_CHECKING:
    import numpy as np

# auto's order (module docstring).
RUNTIMES = ("openvino", "onnxruntime", "tensorflow")
# What each runtime imports, and the pip extra that installs it.
MODULES = {"openvino": "openvino", "onnxruntime": "onnxruntime", "tensorflow": "tensorflow"}
EXTRAS = {"openvino": "deploy", "onnxruntime": "deploy", "tensorflow": "cpu"}
# The artifact each runtime reads: a file suffix, or a folder for TensorFlow's SavedModel.
ARTIFACTS = {"openvino": ".xml", "onnxruntime": ".onnx", "tensorflow": "saved_model"}
# ONNX Runtime's input type names of the input dtypes an export may have.
ONNX_TYPES = {"tensor(uint8)": "uint8", "tensor(float)": "float32"}
# OpenVINO's performance hints (`PERFORMANCE_HINT`); see the module docstring for the choice.
OPENVINO_HINTS = ("LATENCY", "THROUGHPUT")


class RuntimeMissing(ImportError):
    """A runtime asked for by name is not installed here; the message names the pip extra."""


def check_runtime(runtime: str) -> str:
    """`runtime` when it is one of RUNTIMES, else a ValueError naming the valid ones."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    return runtime


@functools.cache
def _import_problem(runtime: str) -> str | None:
    """Why `runtime` cannot be imported here, or None. An install that is present but broken
    counts as missing (it would fail the first call anyway)."""
    try:
        importlib.import_module(MODULES[runtime])
    except Exception as error:  # ImportError, or a broken install's own error
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"{type(error).__name__}: {first}"
    return None


def installed(runtime: str) -> bool:
    """Whether `runtime` (one of RUNTIMES) imports here (importing it now, once)."""
    return _import_problem(check_runtime(runtime)) is None


def available_runtimes() -> list[str]:
    """The runtimes of RUNTIMES that import here, in auto's order (fastest first)."""
    return [runtime for runtime in RUNTIMES if installed(runtime)]


def require_runtime(runtime: str) -> str:
    """`runtime` when it is known and imports, else ValueError (unknown) or RuntimeMissing
    (naming the pip extra that installs it)."""
    check_runtime(runtime)
    problem = _import_problem(runtime)
    if problem:
        raise RuntimeMissing(
            f"runtime {runtime!r} is not installed here ({problem}): install it with pip "
            f"install \"keras-efficientnet[{EXTRAS[runtime]}]\"")
    return runtime


def default_threads() -> int:
    """Intra-op threads of a session: one per core this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Session:
    """One loaded model on one runtime: `session(images)` -> probabilities.

    Args:
        runtime: one of RUNTIMES.
        path: the artifact it runs (ARTIFACTS).
        run: the runtime's call, uint8 `[n, h, w, 3]` -> float32 `[n, classes]`.
        input_shape: the artifact's input shape (`None` for a dynamic dimension).
        output_shape: its output shape, `[batch, classes]`.
        settings: what was chosen for the runtime (hint, threads), for benchmark rows.

    Example:
      >>> session = open_session("model.onnx", "onnxruntime")
      >>> probabilities = session(np.zeros((2, 224, 224, 3), np.uint8))  # (2, classes)
    """

    def __init__(self, runtime: str, path: Path, run: Callable[[np.ndarray], np.ndarray],
                 input_shape: tuple, output_shape: tuple, settings: dict):
        self.runtime = runtime
        self.path = path
        self._run = run
        self.input_shape = input_shape
        self.output_shape = output_shape
        self.settings = settings

    def __call__(self, images) -> np.ndarray:
        import numpy as np
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"{self.runtime} session of {self.path}: expected uint8 images "
                             f"[batch, height, width, 3], received {images.dtype} "
                             f"{list(images.shape)}")
        expected = self.input_shape[1:3]
        if all(side is not None for side in expected) and tuple(images.shape[1:3]) != tuple(
                expected):
            raise ValueError(f"{self.runtime} session of {self.path}: the model takes "
                             f"{expected[0]}x{expected[1]} images, received "
                             f"{images.shape[1]}x{images.shape[2]}")
        return np.asarray(self._run(np.ascontiguousarray(images)), np.float32)

    def __repr__(self) -> str:
        return f"Session({self.runtime!r}, {str(self.path)!r}, {self.settings})"


def _check_artifact(path: Path, runtime: str) -> None:
    kind = ARTIFACTS[runtime]
    if kind == "saved_model":
        if not (path / "saved_model.pb").is_file():
            raise ValueError(f"{path}: not a SavedModel folder (no saved_model.pb) for the "
                             "tensorflow runtime")
        return
    allowed = (".xml", ".onnx") if runtime == "openvino" else (kind,)
    if path.suffix.lower() not in allowed or not path.is_file():
        raise ValueError(f"{path}: the {runtime} runtime reads a {' or '.join(allowed)} file")


def open_session(path: str | os.PathLike, runtime: str, *, threads: int | None = None,
                 hint: str = "LATENCY") -> Session:
    """Loads the artifact at `path` on `runtime` (module docstring): a Session that takes
    uint8 NHWC images and returns float32 probabilities. `threads` (default: one per core)
    sets ONNX Runtime's intra-op threads and OpenVINO's inference threads; `hint` is
    OpenVINO's performance hint (ignored by the others). ValueError for an unknown runtime or
    a path it cannot read; RuntimeMissing where the runtime is not installed."""
    require_runtime(runtime)
    path = Path(path)
    _check_artifact(path, runtime)
    threads = threads or default_threads()
    if runtime == "openvino":
        return _openvino(path, threads, hint)
    if runtime == "onnxruntime":
        return _onnxruntime(path, threads)
    return _tensorflow(path)


def _openvino(path: Path, threads: int, hint: str) -> Session:
    import numpy as np
    import openvino as ov

    if hint not in OPENVINO_HINTS:
        raise ValueError(f"OpenVINO hint {hint!r}: choose one of {', '.join(OPENVINO_HINTS)}")
    core = ov.Core()
    model = core.read_model(str(path))
    shape = tuple(None if d.is_dynamic else d.get_length()
                  for d in model.inputs[0].get_partial_shape())
    dtype = np.dtype(model.inputs[0].get_element_type().to_dtype())
    config = {"PERFORMANCE_HINT": hint, "INFERENCE_NUM_THREADS": threads,
              # float32 as exported: without it OpenVINO may compute in bf16 on CPUs that have
              # it, and the outputs would no longer match TensorFlow's.
              "INFERENCE_PRECISION_HINT": "f32"}
    programs: dict[int, object] = {}
    requests: dict[int, list] = {}

    def program_for(batch: int):
        # One compiled model per batch size: a static shape runs faster than a dynamic one.
        if batch not in programs:
            sized = model.clone()
            sized.reshape({sized.inputs[0]: ov.PartialShape([batch, *shape[1:]])})
            programs[batch] = core.compile_model(sized, "CPU", config)
            requests[batch] = []
        return programs[batch]

    def request_for(batch: int, index: int):
        program = program_for(batch)
        while len(requests[batch]) <= index:
            requests[batch].append(program.create_infer_request())
        return requests[batch][index]

    def run(images: np.ndarray) -> np.ndarray:
        images = images.astype(dtype, copy=False)  # see _onnxruntime
        if hint == "LATENCY":
            return request_for(images.shape[0], 0).infer({0: images})[0].copy()
        # THROUGHPUT: the batch split into one part per stream, run side by side.
        streams = program_for(images.shape[0]).get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")
        parts = np.array_split(images, min(streams, images.shape[0]))
        started = []
        for index, part in enumerate(parts):
            request = request_for(part.shape[0], index)
            request.start_async({0: part})
            started.append(request)
        outputs = []
        for request in started:
            request.wait()
            outputs.append(request.get_output_tensor(0).data.copy())
        return np.concatenate(outputs)

    outputs = tuple(None if d.is_dynamic else d.get_length()
                    for d in model.outputs[0].get_partial_shape())
    return Session("openvino", path, run, shape, outputs, {"hint": hint, "threads": threads})


def _onnxruntime(path: Path, threads: int) -> Session:
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1  # sequential execution: one op at a time on all threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    first = session.get_inputs()[0]
    shape = tuple(d if isinstance(d, int) else None for d in first.shape)
    output = session.get_outputs()[0].name
    outputs = tuple(d if isinstance(d, int) else None for d in session.get_outputs()[0].shape)
    # ONNX's type names, "tensor(uint8)", to NumPy's; an export with a float input (tf2onnx of
    # a float signature) takes the same pixel values, exactly, as float.
    dtype = np.dtype(ONNX_TYPES.get(first.type, "uint8"))

    def run(images: np.ndarray) -> np.ndarray:
        return session.run([output], {first.name: images.astype(dtype, copy=False)})[0]

    return Session("onnxruntime", path, run, shape, outputs, {"threads": threads})


def _tensorflow(path: Path) -> Session:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    signature = loaded.signatures["serving_default"]
    spec = list(signature.structured_input_signature[1].values())[0]
    shape = tuple(spec.shape.as_list())
    outputs = tuple(next(iter(signature.structured_outputs.values())).shape.as_list())

    def run(images: np.ndarray) -> np.ndarray:
        outputs = signature(tf.constant(images.astype(spec.dtype.as_numpy_dtype, copy=False)))
        return next(iter(outputs.values())).numpy()

    # Kept with the session: the signature's variables live as long as `loaded` does.
    run.loaded = loaded  # type: ignore[attr-defined]
    return Session("tensorflow", path, run, shape, outputs, {})


# ------------------------------------------------------------------------------ export cache

CACHE_SUFFIX = ".deploy"
# The artifact file each runtime's cache entry holds (OpenVINO's weights lie beside, .bin).
CACHED_NAMES = {"onnxruntime": "model.onnx", "openvino": "model.xml"}


def content_digest(model_file: str | os.PathLike, version: str = "") -> str:
    """SHA-256 of the model file's bytes (and `version`, the exporter's: a new exporter
    exports again)."""
    digest = hashlib.sha256()
    with open(model_file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    digest.update(b"\0" + version.encode())
    return digest.hexdigest()


def cache_root(model_file: str | os.PathLike) -> Path:
    """The folder beside `model_file` that holds its exports: `<model_file>.deploy/`."""
    model_file = Path(model_file)
    return model_file.with_name(model_file.name + CACHE_SUFFIX)


def cached_artifact(model_file: str | os.PathLike, runtime: str,
                    build: Callable[[Path], Path], version: str = "") -> tuple[Path, bool]:
    """The export of `model_file` that `runtime` reads, from the cache beside it
    (`<model_file>.deploy/<content digest>/model.onnx|model.xml`), made by `build(folder)` (which
    writes the artifact into a new empty folder and returns its path) where missing; returns
    (path, whether it was exported now).

    The entry is keyed by the file's content (`content_digest`), so a changed model exports
    again and the entries of its earlier contents are removed. Writes are atomic: the artifact
    is built in a temporary folder and renamed into place, its main file (the .xml or .onnx,
    which a reader looks for) last, so a stopped export leaves no entry that looks complete."""
    if runtime not in CACHED_NAMES:
        raise ValueError(f"no cached export for runtime {runtime!r}: choose one of "
                         f"{', '.join(CACHED_NAMES)}")
    root = check_directory(cache_root(model_file))
    entry = root / content_digest(model_file, version)
    target = entry / CACHED_NAMES[runtime]
    if target.is_file() and (runtime != "openvino" or target.with_suffix(".bin").is_file()):
        return target, False
    root.mkdir(exist_ok=True)
    for stale in root.iterdir():  # exports of the file's earlier contents
        if stale.is_dir() and not stale.name.startswith(".") and stale != entry:
            shutil.rmtree(stale, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(dir=root, prefix=".export-"))
    try:
        built = Path(build(scratch))
        if built.parent != scratch or built.name != target.name:
            raise ValueError(f"the {runtime} export wrote {built}, expected "
                             f"{scratch / target.name}")
        entry.mkdir(exist_ok=True)
        # The main file last: a reader takes the entry as complete once it is there.
        for path in sorted(scratch.iterdir(), key=lambda p: p.name == target.name):
            os.replace(path, entry / path.name)
        fsync_directory(entry)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target, True
