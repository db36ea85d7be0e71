"""`keras-efficientnet-predict --model_file=MODEL.keras PATH...`: the top classes of each image.

PATHs are image files or folders (searched recursively for .jpg, .jpeg, .png, .bmp and .gif).
Each image is read as a training run evaluates it: decoded, its short side resized to
`resolution x 256/224`, the centre square cropped to the model's resolution, uint8; images go
to the model `--batch_size` at a time. Class names come from `--class_names`, else from the
`class_names.json` that training writes beside `model.keras`, else, for a 1000-class model, from
ImageNet's (package data, `ke.decode_predictions`); otherwise classes print as their index.

`--runtime` chooses what runs the model: `tensorflow` (Keras, as trained), `openvino` or
`onnxruntime` (`keras_efficientnet.deploy.runtimes`; `pip install "keras-efficientnet[deploy]"`),
or `auto` (the default): the fastest installed, measured once per model file on its exports
(where both OpenVINO and ONNX Runtime are installed; `keras_efficientnet.deploy.runtimes` says
why it is measured rather than a fixed order), else the one installed, else TensorFlow.
A runtime other than TensorFlow runs the model's export, made once and kept beside the model
file in `MODEL.keras.deploy/<SHA-256 of the file>/` (a changed model file exports again); its
outputs equal TensorFlow's to 1e-5. Where `auto`
cannot use one (`--serving` other than auto, a model without a fixed resolution, an export or a
cache folder that fails) it predicts with TensorFlow, in the last two cases after one warning
line.

Everything a user can get wrong is checked before TensorFlow loads (in well under a second):
the flags, that the model is a Keras zip with a classifier head, that every path exists and
every file starts like an image. Each failure is one line naming the file. Exit status
(`cli.errors`): 0 done, 2 bad input (flags, paths, files that are not images or not models; the
readable images are still predicted and written), 1 a failure on the way (an output that cannot
be written), 128 + N stopped by signal N (143 SIGTERM, 130 SIGINT; `--output` is then not
written).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path

from keras_efficientnet.atomic import UnsafePathError, describe_path, open_file
from keras_efficientnet.cli.errors import BAD_INPUT, RUN_FAILED, BadInput
from keras_efficientnet.cli.parser import (
    CommandParser,
    add_verbosity,
    check_model_file,
    command_status,
    model_file,
    run_command,
)
from keras_efficientnet.datasets.options import EVAL_RESIZE_RATIO, IMAGE_EXTENSIONS
from keras_efficientnet.deploy import runtimes
from keras_efficientnet.runs.record import CLASS_NAMES, strict

CLASS_NAMES_FILE = CLASS_NAMES  # as keras_efficientnet.training.export writes it
# The first bytes of each format TensorFlow's decode_image reads.
IMAGE_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM")
OUTPUT_SUFFIXES = (".csv", ".jsonl")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("keras-efficientnet-predict", __doc__)
    parser.add_argument("paths", nargs="*", metavar="PATH", help="image files or folders")
    parser.add_argument("--model_file", help="a .keras model file, e.g. "
                        "runs/default/model.keras (required; --model is its deprecated "
                        "spelling)")
    parser.add_argument("--output", default="", help="also write the predictions to FILE.csv "
                        "(one row per image) or FILE.jsonl (one JSON object per image)")
    parser.add_argument("--top_k", type=int, default=5, help="classes per image")
    parser.add_argument("--batch_size", type=int, default=32, help="images per model call")
    parser.add_argument("--class_names", default="", help="JSON list of class names in label "
                        "order, or 'imagenet'; empty = class_names.json beside the model, else "
                        "ImageNet's for a 1000-class model")
    parser.add_argument("--resolution", type=int, default=0, help="input resolution for models "
                        "that take any size; 0 = the model's")
    parser.add_argument("--resize_ratio", type=float, default=EVAL_RESIZE_RATIO,
                        help="resize the short side to resolution x this before the centre "
                        "crop (as evaluation does)")
    parser.add_argument("--serving", default="auto", choices=("auto", "on", "off"),
                        help="auto runs LayerNorm/GroupNorm models through the fused forward "
                        "pass of keras_efficientnet.serving (same outputs, faster); off keeps "
                        "Keras' layers")
    parser.add_argument("--runtime", default="auto", choices=("auto", *runtimes.RUNTIMES),
                        help="what runs the model: auto = the fastest installed (openvino or "
                        "onnxruntime, timed once per model file; else tensorflow); openvino "
                        "and onnxruntime run an export cached beside the model file (pip "
                        "install \"keras-efficientnet[deploy]\")")
    add_verbosity(parser)
    return parser


def _check_numbers(args) -> None:
    for name, low in (("top_k", 1), ("batch_size", 1), ("resolution", 0)):
        if getattr(args, name) < low:
            raise BadInput(f"--{name}={getattr(args, name)}: must be at least {low}")
    if args.resize_ratio < 1.0:
        raise BadInput(f"--resize_ratio={args.resize_ratio}: must be at least 1.0")
    found = describe_path(Path(args.output)) if args.output else None
    if found:  # said before the model loads, not after every image is predicted
        raise BadInput(f"--output={args.output!r} is {found}: predict writes its own regular "
                       "file there, never into a folder or through a link; give the path of a "
                       "new .csv or .jsonl file (or remove what is there)")
    if args.output and Path(args.output).suffix.lower() not in OUTPUT_SUFFIXES:
        raise BadInput(f"--output={args.output!r}: give a .csv or .jsonl file")
    if args.output and not Path(args.output).resolve().parent.is_dir():
        raise BadInput(f"--output={args.output!r}: folder {str(Path(args.output).parent)!r} "
                       "does not exist")


def expand_paths(paths: list[str]) -> list[Path]:
    """Files as given, folders as their image files (recursive, sorted); BadInput for a path
    that does not exist or a folder without images."""
    if not paths:
        raise BadInput("no images given: keras-efficientnet-predict --model_file=MODEL.keras "
                       "IMAGE_OR_FOLDER [...]")
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.rglob("*")
                           if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
            if not found:
                raise BadInput(f"{path}: folder holds no {', '.join(IMAGE_EXTENSIONS)} files")
            files.extend(found)
        elif path.exists():  # a pipe or device too: not_an_image names it, it never blocks
            files.append(path)
        else:
            raise BadInput(f"{path}: no such file or folder")
    return files


def not_an_image(path: Path) -> str | None:
    """Why `path` cannot be an image TensorFlow decodes, judged by its first bytes, or None."""
    try:
        with open_file(path, "rb", links=True) as f:  # never blocks on a pipe
            head = f.read(8)
    except UnsafePathError as error:
        return str(error)
    except OSError as error:
        return f"{path}: cannot be read ({error.strerror})"
    if not head.startswith(IMAGE_SIGNATURES):
        return f"{path}: not an image (expected JPEG, PNG, BMP or GIF)"
    return None


def _read_names(path: Path) -> list[str]:
    try:
        with open_file(path) as f:  # a run's class_names.json: never through a link
            names = json.loads(f.read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, UnsafePathError) as error:
        raise BadInput(f"{path}: not a JSON list of class names ({error})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BadInput(f"{path}: expected a JSON list of class names (strings)")
    return names


def class_names_for(option: str, model_path: Path) -> list[str] | str | None:
    """The names from --class_names or beside the model; "imagenet" where ImageNet's apply
    (decided once the model's class count is known); None for none."""
    if option == "imagenet":
        return "imagenet"
    if option:
        if not Path(option).is_file():
            raise BadInput(f"--class_names={option!r}: no such file")
        return _read_names(Path(option))
    beside = model_path.with_name(CLASS_NAMES_FILE)
    return _read_names(beside) if beside.is_file() else None


def _resolve_names(names, classes: int, model_path: Path, option: str) -> list[str] | None:
    from keras_efficientnet.models.imagenet_classes import NUM_CLASSES, imagenet_class_names

    if names == "imagenet" or (names is None and classes == NUM_CLASSES):
        if classes != NUM_CLASSES:
            raise BadInput(f"--class_names=imagenet: {model_path} has {classes} classes, "
                           f"not ImageNet's {NUM_CLASSES}")
        return imagenet_class_names()
    if names is not None and len(names) != classes:
        where = f"--class_names={option!r}" if option else str(
            model_path.with_name(CLASS_NAMES_FILE))
        raise BadInput(f"{where}: {len(names)} class names for a model of {classes} classes")
    return names


def _probabilities(outputs):
    # A model whose classifier emits logits (built with classifier_activation=None): its rows
    # are not distributions, so softmax them.
    import numpy as np

    outputs = np.asarray(outputs, np.float64)
    if outputs.min() >= 0 and np.allclose(outputs.sum(axis=-1), 1.0, atol=1e-3):
        return outputs
    shifted = np.exp(outputs - outputs.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def read_images(paths: list[Path], resolution: int, resize_ratio: float):
    """(uint8 crops `[n, resolution, resolution, 3]` of the files that decode, their paths,
    one line per file that does not)."""
    import numpy as np
    import tensorflow as tf

    from keras_efficientnet.datasets.preprocessing import center_crop

    crops, good, failures = [], [], []
    for path in paths:
        try:
            # The name's own bytes: a name that is not UTF-8 has no str TensorFlow can take.
            crops.append(center_crop(tf.io.read_file(os.fsencode(path)), resolution,
                                     resize_ratio).numpy())
            good.append(path)
        except (tf.errors.InvalidArgumentError, tf.errors.OpError) as error:
            reason = (error.message or type(error).__name__).strip().splitlines()[0]
            failures.append(f"{path}: not an image TensorFlow can decode ({reason})")
    shape = (0, resolution, resolution, 3)
    return (np.stack(crops) if crops else np.zeros(shape, np.uint8)), good, failures


def predict(model, image_paths, resolution: int, resize_ratio: float = EVAL_RESIZE_RATIO,
            serving: str = "auto"):
    """Class probabilities `[images, classes]` of `model` for the image files (all must
    decode); `serving` as `keras_efficientnet.serving.for_inference` takes it."""
    from keras_efficientnet.serving import for_inference

    images, _, failures = read_images([Path(p) for p in image_paths], resolution, resize_ratio)
    if failures:
        raise ValueError(failures[0])
    # Keras' own predict of the chosen path (EfficientNet.predict would choose again).
    import keras

    return _probabilities(keras.Model.predict(for_inference(model, serving), images, verbose=0))


def top_k_rows(paths, probabilities, k: int, names: list[str] | None) -> list[dict]:
    """One record per image: its path and its k best classes (index, name, probability)."""
    import numpy as np

    rows = []
    for path, row in zip(paths, probabilities):
        best = np.argsort(-row, kind="stable")[:k]
        rows.append({"path": str(path), "top_k": [
            {"index": int(i), "name": names[i] if names else f"class {i}",
             "probability": round(float(row[i]), 6)} for i in best]})
    return rows


def format_top_k(record: dict) -> str:
    """The path, then one line per class: rank, name (or index) and probability."""
    lines = [record["path"]]
    for rank, top in enumerate(record["top_k"], start=1):
        lines.append(f"  {rank}. {top['name']:<24} {top['probability']:.4f}")
    return "\n".join(lines)


# A spreadsheet runs a cell that starts with these as a formula (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value: str) -> str:
    """`value` as a CSV cell no spreadsheet runs: a leading `'` (a spreadsheet's "text" mark,
    not displayed) before a formula start, and before a leading `'` itself, so that a reader
    recovers every value exactly by dropping one leading `'` where there is one."""
    return f"'{value}" if value.startswith((*FORMULA_STARTS, "'")) else value


def render_output(records: list[dict], suffix: str) -> str:
    """CSV (path, then name, index and probability of each rank; text cells through
    `csv_text`) or JSON lines."""
    if suffix == ".jsonl":
        # A model with non-finite outputs gives NaN probabilities: null in strict JSON.
        return "".join(json.dumps(strict(record), allow_nan=False) + "\n"
                       for record in records)
    k = max((len(r["top_k"]) for r in records), default=0)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["path"] + [f"{what}_{rank}" for rank in range(1, k + 1)
                                for what in ("class", "index", "probability")])
    for record in records:
        ranks = [value for top in record["top_k"] for value in (
            csv_text(top["name"]), top["index"], f"{top['probability']:.6f}")]
        writer.writerow([csv_text(record["path"]), *ranks])
    return text.getvalue()


def _check_inputs(args):
    _check_numbers(args)
    args.model_file = model_file(args.model_file)  # a run RUN[:final|best]: its .keras file
    config = check_model_file(args.model_file)
    files = expand_paths(args.paths)
    names = class_names_for(args.class_names, Path(args.model_file))
    return config, files, names


def _load_keras(args):
    """The Keras model of --model_file, checked to output class scores."""
    from keras_efficientnet.cli import quiet

    quiet.import_tensorflow(verbose=args.verbosity > 0)
    from keras_efficientnet.registration import load_model

    try:  # registers the package's classes with Keras first
        model = load_model(args.model_file)
    except Exception as error:  # a damaged zip, unknown classes: one line, not Keras' report
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise BadInput(f"{args.model_file}: Keras cannot load this model ({reason})") from None
    shape = model.output_shape
    if isinstance(shape, list) or len(shape) != 2:
        raise BadInput(f"{args.model_file}: no classifier head (its output has shape {shape}); "
                       "predict needs a model that outputs class scores [batch, classes]")
    return model


def _load(args, names):
    """(a callable images -> class scores, resolution, class names) on TensorFlow."""
    model = _load_keras(args)
    resolution = args.resolution or model.input_shape[1]
    if resolution is None:
        raise BadInput(f"{args.model_file} takes any resolution; give --resolution")
    names = _resolve_names(names, model.output_shape[-1], Path(args.model_file),
                           args.class_names)
    from keras_efficientnet.serving import for_inference

    try:
        served = for_inference(model, args.serving)
    except ValueError as error:  # --serving=on for a model the fused pass cannot run
        raise BadInput(f"--serving={args.serving}: {error}") from None
    return served.predict_on_batch, resolution, names


def choose_runtime(args) -> str:
    """The runtime --runtime names, checked to be installed (BadInput naming the pip extra),
    or for auto the first installed of runtimes.RUNTIMES that can run this request (where
    both export runtimes are, `_load_fastest` then measures which)."""
    if args.runtime != "auto":
        if args.runtime != "tensorflow" and args.serving != "auto":
            raise BadInput(f"--serving={args.serving} chooses TensorFlow's computation: give "
                           f"--runtime=tensorflow (or auto), not --runtime={args.runtime}")
        if args.runtime == "tensorflow":  # imported quietly below (its start-up lines)
            return args.runtime
        try:
            return runtimes.require_runtime(args.runtime)
        except runtimes.RuntimeMissing as error:
            raise BadInput(f"--runtime={args.runtime}: {error}") from None
    if args.serving != "auto":  # a choice only TensorFlow's computation has
        return "tensorflow"
    # TensorFlow last: it is needed below in any case, and is imported quietly there.
    return next((runtime for runtime in runtimes.RUNTIMES[:-1] if runtimes.installed(runtime)),
                "tensorflow")


def _export(args, runtime: str, folder: Path, model_holder: list) -> Path:
    """Writes the export `runtime` reads into the empty `folder` (the cache's build step)."""
    from keras_efficientnet.cli import quiet

    quiet.import_tensorflow(verbose=args.verbosity > 0)  # the exporters import Keras
    from keras_efficientnet.deploy import export_onnx, export_openvino

    if runtime == "openvino":  # from the cached ONNX export, made first where missing
        onnx, _ = _cached(args, "onnxruntime", model_holder)
        return Path(export_openvino(onnx, folder / runtimes.CACHED_NAMES[runtime]))
    if not model_holder:
        model_holder.append(_load_keras(args))
    return Path(export_onnx(model_holder[0], folder / runtimes.CACHED_NAMES[runtime]))


def _cached(args, runtime: str, model_holder: list) -> tuple[Path, bool]:
    from keras_efficientnet import __version__

    return runtimes.cached_artifact(
        args.model_file, runtime, lambda folder: _export(args, runtime, folder, model_holder),
        version=__version__)


def _load_deployed(args, runtime: str, names):
    """(the runtime's session, resolution, class names): the cached export, made now if
    missing."""
    model_holder: list = []  # the Keras model, loaded only where an export is made
    path, exported = _cached(args, runtime, model_holder)
    if exported and args.verbosity > 0:
        print(f"exported {args.model_file} for {runtime}: {path} (made once; later runs of "
              "this model file reuse it)", file=sys.stderr)
    session = runtimes.open_session(path, runtime)
    resolution = session.input_shape[1]
    if args.resolution and args.resolution != resolution:
        raise BadInput(f"--resolution={args.resolution}: the {runtime} export of "
                       f"{args.model_file} takes {resolution}x{resolution} images, as the "
                       "model does")
    names = _resolve_names(names, session.output_shape[-1], Path(args.model_file),
                           args.class_names)
    return session, resolution, names


def _load_fastest(args, names):
    """auto's (session, resolution, class names): the installed export runtime that ran this
    model file fastest, measured once on its exports and recorded beside them
    (`runtimes.RATES_NAME`; module docstring of `keras_efficientnet.deploy.runtimes`)."""
    candidates = [r for r in runtimes.RUNTIMES[:-1] if runtimes.installed(r)]
    if len(candidates) == 1:
        return _load_deployed(args, candidates[0], names)
    batch = min(args.batch_size, runtimes.TIMING_BATCH)
    model_holder: list = []  # the Keras model, loaded once where exports are made
    paths = {runtime: _cached(args, runtime, model_holder)[0] for runtime in candidates}
    entry = next(iter(paths.values())).parent
    rates = runtimes.recorded_rates(entry, candidates, batch)
    if rates is not None:
        return _load_deployed(args, runtimes.fastest(rates), names)
    loaded = {runtime: _load_deployed(args, runtime, names) for runtime in candidates}
    rates = {runtime: runtimes.measure_rate(loaded[runtime][0], batch)
             for runtime in candidates}
    record = runtimes.record_rates(entry, rates, batch)
    chosen = runtimes.fastest(rates)
    if args.verbosity > 0:
        measured = ", ".join(f"{runtime} {rate:.1f}" for runtime, rate in rates.items())
        print(f"--runtime=auto: {chosen}, the fastest for {args.model_file} (images/s at "
              f"batch {batch}: {measured}; measured once, kept in {record})", file=sys.stderr)
    return loaded[chosen]


def load_predictor(args, names):
    """(a callable uint8 images -> class scores, resolution, class names) on the runtime
    `choose_runtime` picks; `auto` falls back to TensorFlow, with one warning line, where its
    runtime cannot be used for this model."""
    runtime = choose_runtime(args)
    # The first line within a second: loading TensorFlow (or a runtime) takes seconds. On a
    # terminal's stderr only: stdout holds the predictions, and a log keeps errors alone.
    if sys.stderr.isatty():
        print(f"loading: {args.model_file} on {runtime}", file=sys.stderr, flush=True)
    if runtime == "tensorflow":
        return _load(args, names)
    from keras_efficientnet.cli import errors

    if args.runtime == "auto":
        try:
            return _load_fastest(args, names)
        except BadInput:
            raise
        except Exception as error:  # an export or a cache folder that failed
            print(f"warning: --runtime=auto: {runtime} cannot run {args.model_file} "
                  f"({errors.one_line(error)}); predicting with tensorflow", file=sys.stderr)
            return _load(args, names)
    try:
        return _load_deployed(args, runtime, names)
    except (ValueError, OSError) as error:  # the folder beside the model, a failed export
        raise BadInput(f"--runtime={runtime}: {errors.one_line(error)}") from None


def _predict_all(infer, files, resolution, args, names):
    from keras_efficientnet.cli import quiet

    # TensorFlow decodes the images (read_images) whichever runtime predicts: imported quietly
    # here too, or an ONNX Runtime or OpenVINO run printed its start-up lines (a no-op where
    # the TensorFlow runtime already imported it).
    quiet.import_tensorflow(verbose=args.verbosity > 0)
    records, failures, dark = [], [], []
    for start in range(0, len(files), args.batch_size):
        images, good, failed = read_images(files[start:start + args.batch_size], resolution,
                                           args.resize_ratio)
        failures += failed
        if not good:
            continue
        dark += [p for p, image in zip(good, images) if image.max() <= 1]
        probabilities = _probabilities(infer(images))
        k = min(args.top_k, probabilities.shape[-1])
        records += top_k_rows(good, probabilities, k, names)
    if dark:  # an image saved from floats in [0, 1] without x255 is black in uint8
        print(f"warning: {dark[0]}" + (f" and {len(dark) - 1} more" if len(dark) > 1 else "") +
              ": every pixel is 0 or 1; were they saved from floats in [0, 1] without "
              "multiplying by 255?", file=sys.stderr)
    return records, failures


def _printable(text: str) -> str:
    """`text` with the bytes of a file name that is not UTF-8 as `\\xff` escapes (a terminal
    may not take them raw)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _write(records, args) -> None:
    from keras_efficientnet.atomic import atomic_file, open_file

    if args.output:
        text = render_output(records, Path(args.output).suffix.lower())
        with atomic_file(args.output) as tmp, open_file(tmp, "wb") as f:
            # A name that is not UTF-8 is written as its own bytes (surrogateescape), so that
            # reading the file back the same way gives the very path (JSON escapes it itself).
            f.write(text.encode("utf-8", "surrogateescape"))
        print(_printable(f"wrote {len(records)} predictions to {args.output}"))
    else:
        for record in records:
            print(_printable(format_top_k(record)))


def _predict(argv: list[str]) -> int:
    args = build_parser().parse_args(argv[1:])
    _, files, names = _check_inputs(args)
    problems = {f: not_an_image(f) for f in files}  # reads each file's first bytes once
    unreadable = [line for line in problems.values() if line]
    files = [f for f, line in problems.items() if line is None]
    for line in unreadable:
        print(f"error: {line}", file=sys.stderr)
    if not files:
        return BAD_INPUT
    infer, resolution, names = load_predictor(args, names)
    records, failures = _predict_all(infer, files, resolution, args, names)
    for line in failures:
        print(f"error: {line}", file=sys.stderr)
    try:
        _write(records, args)
    except OSError as error:
        print(f"error: --output={args.output!r}: cannot be written ({error.strerror or error})",
              file=sys.stderr)
        return RUN_FAILED
    return BAD_INPUT if unreadable or failures else 0


def main(argv: list[str] | None = None) -> int:
    """Runs the command; `argv` as `sys.argv` (the program name first). Returns the status."""
    return command_status(_predict, sys.argv if argv is None else argv,
                          "the predictions are incomplete and --output was not written; run "
                          "the same command again")


def run() -> None:
    """Console-script entry point (`keras-efficientnet-predict`)."""
    run_command(main)


if __name__ == "__main__":
    run()
