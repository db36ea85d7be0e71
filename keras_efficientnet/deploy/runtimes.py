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

`auto` (the predict command's `--runtime=auto`) measures: where OpenVINO and ONNX Runtime are
both installed it times each on the model's export once (`measure_rate`, at the predict batch
size up to TIMING_BATCH) and keeps the rates beside the exports (`rates.json` in the model's
cache entry, so again only for a changed model file); TensorFlow is what it falls back to.
No fixed order holds: on a quiet 2-core AMD EPYC issue 33 found OpenVINO about 1.7x ONNX
Runtime for timm's B0 and our G1-BN, but our G16 models' grouped convolutions run on a slower
OpenVINO kernel in float32 (docs/deploy.md), and on a loaded machine the order changes from run
to run (`make benchmark-deploy`). `RUNTIMES` is the order of the names, and of ties.
Every session takes `[batch, height, width, 3]` uint8 images (the
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

# The runtimes, the order of ties in auto's measurement (module docstring).
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
    """The runtimes of RUNTIMES that import here, in RUNTIMES' order."""
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
    # No spinning: ONNX Runtime's idle workers otherwise busy-wait after each call, taking the
    # cores from the process's next work (an OpenVINO call, the image reading) and, on a
    # shared CPU, from each other. Measured on the project's 2-core EPYC at load 12-13, same
    # process (docs/deploy.md): timm's B0 at batch 1 8.4 -> 57 images/s, G16-LN+PN 4.6 -> 21;
    # at batch 16 timm 7.5 -> 12.5, G16-LN+PN 3.1 -> 4.3.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
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


# ------------------------------------------------------------------------- auto's measurement

# What `auto` measures between the installed export runtimes, kept in the model's cache entry
# beside the exports (so once per model content): images/s of each at one batch size.
RATES_NAME = "rates.json"
# The timing batch: the predict batch size, at most this (a B0 call at batch 8 takes about a
# second on a quiet 2-core CPU; the measurement runs once per model file).
TIMING_BATCH = 8
TIMING_CALLS = 3  # best of, after one warm-up call


def measure_rate(session: Session, batch: int, *, calls: int = TIMING_CALLS) -> float:
    """Images/s of `session` at `batch` (the best of `calls` timed calls after one warm-up),
    on mid-grey images of the session's size."""
    import time

    import numpy as np

    height, width = (side or 224 for side in session.input_shape[1:3])
    images = np.full((batch, height, width, 3), 128, np.uint8)
    session(images)  # the warm-up: compiles for this batch size, fills caches
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        session(images)
        best = min(best, time.perf_counter() - start)
    return batch / best


def recorded_rates(entry: Path, runtimes: list[str], batch: int) -> dict[str, float] | None:
    """{runtime: images/s} that `entry`'s RATES_NAME holds for exactly `runtimes` at `batch`,
    or None (no record, another batch or set of runtimes, or a file that does not parse)."""
    import json

    try:
        record = json.loads((Path(entry) / RATES_NAME).read_text())
        rates = {name: float(rate) for name, rate in record["images_per_second"].items()}
        if record["batch"] != batch or sorted(rates) != sorted(runtimes):
            return None
        if not all(rate > 0 for rate in rates.values()):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return rates


def record_rates(entry: Path, rates: dict[str, float], batch: int) -> Path:
    """Writes `rates` ({runtime: images/s} at `batch`) to `entry`'s RATES_NAME, atomically,
    with the load average it was measured under; returns the file's path."""
    import json

    from keras_efficientnet.atomic import write_atomically

    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:  # not on a Unix
        load = None
    return write_atomically(Path(entry) / RATES_NAME, json.dumps({
        "batch": batch, "images_per_second": {
            name: round(rate, 3) for name, rate in rates.items()}, "load_average_1m": load},
        indent=1, allow_nan=False) + "\n")


def fastest(rates: dict[str, float]) -> str:
    """The runtime of `rates` with the highest images/s (ties: the first in RUNTIMES)."""
    return max(rates, key=lambda name: (rates[name], -RUNTIMES.index(name)))
