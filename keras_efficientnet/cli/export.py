"""`keras-efficientnet-export SOURCE --output=PATH`: a trained model as a serving artifact.

SOURCE is a run directory (its final model, `model.keras`) or a `.keras` file. `--format`
chooses the artifact, each taking uint8 images `[batch, height, width, 3]` and returning class
probabilities:

- `saved_model`: a TensorFlow SavedModel (`serving_default`), written as `--export_dir` writes
  it at the end of training (`training.export.export_saved_model`: atomic, and an earlier
  export of ours at PATH is replaced whole while a folder holding anything else is refused);
- `onnx`: an ONNX file (PATH, e.g. model.onnx) made for CPU runtimes, norms and affines folded
  into the convolutions (`keras_efficientnet.deploy.export_onnx`);
- `openvino`: OpenVINO IR (PATH.xml and PATH.bin) of that graph (`deploy.export_openvino`).

`--int8 --calibration=DATASET` (onnx, openvino) quantizes the export after training: int8
convolutions, ranges calibrated on `--calibration_images` images of DATASET's
`--calibration_split` (the trainer's dataset syntax: digits, fashion_mnist, folder:PATH ...),
read as evaluation reads them (a run directory's own `eval_resize_ratio`); openvino through
NNCF, onnx through ONNX Runtime's static quantizer (`keras_efficientnet.deploy.int8`).

`onnx` and `openvino` need the `deploy` extra (pip install 'keras-efficientnet[deploy]').
SOURCE, the model file, PATH and the installed runtimes are checked before TensorFlow loads;
each failure is one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from keras_efficientnet.cli.errors import DONE, BadInput
from keras_efficientnet.cli.parser import (
    CommandParser,
    add_verbosity,
    check_model_file,
    command_status,
    run_command,
)
from keras_efficientnet.cli.parser import model_file as run_model_file
from keras_efficientnet.runs import record, weights

RUN_MODEL_FILE = record.MODEL  # the final model a run writes
FORMATS = ("saved_model", "onnx", "openvino")
# The packages each format needs beyond the base install (all in the `deploy` extra).
FORMAT_PACKAGES = {"saved_model": (), "onnx": ("onnx",), "openvino": ("onnx", "openvino")}
INT8_PACKAGES = {"onnx": ("onnxruntime",), "openvino": ("nncf",)}
DEPLOY_EXTRA = "pip install 'keras-efficientnet[deploy]'"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("keras-efficientnet-export", __doc__)
    parser.add_argument("source", metavar="SOURCE", help="a run directory (its model.keras) or "
                        "a .keras model file")
    parser.add_argument("--output", default="", help="what to write (required): the "
                        "SavedModel's folder (an earlier export there is replaced), the .onnx "
                        "file, or the OpenVINO .xml file (its .bin beside it)")
    parser.add_argument("--format", default="saved_model", choices=FORMATS,
                        help="what to write: saved_model = TensorFlow SavedModel; onnx = ONNX "
                        "for CPU runtimes; openvino = OpenVINO IR (onnx and openvino need the "
                        "deploy extra)")
    parser.add_argument("--int8", action="store_true", help="quantize to int8 (onnx, "
                        "openvino), calibrated on --calibration")
    parser.add_argument("--calibration", default="", metavar="DATASET", help="--int8's "
                        "calibration images: digits, fashion_mnist, folder:PATH, tfds:NAME or "
                        "tfrecord:PATTERN")
    parser.add_argument("--calibration_split", default="train", help="the split they come "
                        "from (default train)")
    parser.add_argument("--calibration_images", type=int, default=300, help="how many "
                        "(default 300)")
    parser.add_argument("--data_dir", default="", help="data directory of the calibration "
                        "source")
    add_verbosity(parser)
    return parser


def model_file_of(source: str) -> Path:
    """The `.keras` file SOURCE names: a run directory's final model (`RUN:best` its best), or
    SOURCE itself (`runs.weights`' grammar)."""
    path, choice = weights.split_choice(source)
    if Path(path).is_dir() and choice is None and not (Path(path) / RUN_MODEL_FILE).is_file():
        raise BadInput(f"SOURCE {source!r} is a folder without {RUN_MODEL_FILE}: give a "
                       "run directory whose training finished, or a .keras file")
    if not Path(path).exists():
        raise BadInput(f"SOURCE {source!r}: no such run directory or file")
    return Path(run_model_file(source, flag="SOURCE"))


def check_packages(names) -> None:
    """BadInput naming the first of `names` (import names) that is not installed."""
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is None:
            raise BadInput(f"{name} is not installed: {DEPLOY_EXTRA}")


def output_path(args) -> Path:
    """The file `--output` names for onnx (as given) and openvino (".xml" appended where
    missing); BadInput where it is a folder or a link."""
    path = Path(args.output)
    if args.format == "openvino" and path.suffix != ".xml":
        path = path.with_name(path.name + ".xml")
    for written in (path, path.with_suffix(".bin")) if args.format == "openvino" else (path,):
        if written.is_symlink() or (written.exists() and not written.is_file()):
            raise BadInput(f"--output={args.output!r}: {written} is a link or a folder; give "
                           f"the {args.format} file to write")
    if path.parent.exists() and not path.parent.is_dir():
        raise BadInput(f"--output={args.output!r}: {path.parent} is not a folder")
    return path


def _check_int8(args) -> None:
    if not args.int8:
        if args.calibration:
            raise BadInput("--calibration is for --int8: add --int8, or leave --calibration out")
        return
    if args.format not in INT8_PACKAGES:
        raise BadInput(f"--int8 quantizes an onnx or openvino export, not --format="
                       f"{args.format}: add --format=onnx or --format=openvino")
    if not args.calibration:
        raise BadInput("--int8 needs --calibration=DATASET: a few hundred training images to "
                       "set the int8 ranges, e.g. --calibration=fashion_mnist")
    if args.calibration_images < 1:
        raise BadInput(f"--calibration_images={args.calibration_images}: must be at least 1")
    from keras_efficientnet.datasets.source_table import missing_local_folder

    try:
        problem = missing_local_folder(args.calibration, args.calibration_split)
    except ValueError as error:  # an unknown kind or a missing argument
        raise BadInput(f"--calibration: {error}") from None
    if problem:
        raise BadInput(f"--calibration={args.calibration}: {problem}")
    check_packages(INT8_PACKAGES[args.format])


def resize_ratio_of(source: str) -> float | None:
    """A run directory's evaluation resize ratio (config.json), else None (the default)."""
    import json

    from keras_efficientnet.atomic import open_file
    from keras_efficientnet.runs.record import RunFiles

    config = RunFiles(weights.split_choice(source)[0]).config
    try:
        with open_file(config) as f:  # never through a link, never blocked on a pipe
            value = json.loads(f.read())["config"].get("eval_resize_ratio")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def _check(args) -> Path:
    model = model_file_of(args.source)
    check_model_file(str(model), flag="SOURCE")
    if not args.output:
        example = {"saved_model": "runs/default/saved_model", "onnx": "runs/default/model.onnx",
                   "openvino": "runs/default/model.xml"}[args.format]
        raise BadInput(f"--output is required: what to write, e.g. --output={example}")
    check_packages(FORMAT_PACKAGES[args.format])
    _check_int8(args)
    if args.format != "saved_model":
        output_path(args)
        return model
    from keras_efficientnet.training.run_dir import check_export_dir

    try:
        check_export_dir(args.output)
    except ValueError as error:  # a link, a file, a folder holding other things
        raise BadInput(str(error).replace("--export_dir", "--output")) from None
    return model


def _export(argv: list[str]) -> int:
    args = build_parser().parse_args(argv[1:])
    model_file = _check(args)
    from keras_efficientnet.cli import errors, quiet

    print(f"loading: TensorFlow, then {model_file}", flush=True)  # seconds of silence else
    quiet.import_tensorflow(verbose=args.verbosity > 0)
    from keras_efficientnet.registration import load_model

    try:  # registers the package's classes with Keras first
        model = load_model(model_file)
    except Exception as error:  # a damaged zip, unknown classes: one line, not Keras' report
        raise BadInput(f"{model_file}: Keras cannot load this model "
                       f"({errors.one_line(error)})") from None
    try:
        written = _write(model, args)
    except Exception as error:  # a refused write (RUN_FAILED), a bad path (BAD_INPUT)
        described = errors.describe(error)
        if described is None:
            raise
        print(described[0], file=sys.stderr, flush=True)
        return described[1]
    shape = tuple(model.inputs[0].shape)
    entry = "serving_default" if args.format == "saved_model" else "images"
    kind = f"int8 {args.format}" if args.int8 else args.format
    print(f"wrote {kind} {written} from {model_file} ({entry}: uint8 images {shape} in, "
          "probabilities out)")
    return DONE


def _write(model, args) -> Path:
    """Writes `model` in `args.format`; returns what was written."""
    if args.format == "saved_model":
        from keras_efficientnet.training.export import export_saved_model

        return export_saved_model(model, args.output)
    try:
        if args.int8:
            return _write_int8(model, args)
        if args.format == "onnx":
            from keras_efficientnet.deploy import export_onnx

            return export_onnx(model, output_path(args))
        from keras_efficientnet.deploy import export_openvino

        return export_openvino(model, output_path(args))
    except ValueError as error:  # a layer the exporter does not know, a model of any size
        raise BadInput(f"SOURCE {args.source!r}: {error}") from None


def _write_int8(model, args) -> Path:
    from keras_efficientnet.deploy import int8

    size = model.inputs[0].shape[1]
    if size is None:
        raise ValueError(f"{model.name} takes any image size; export a model built at one")
    try:
        images = int8.calibration_images(
            args.calibration, size, args.calibration_images, split=args.calibration_split,
            data_dir=args.data_dir or None, resize_ratio=resize_ratio_of(args.source))
    except (ValueError, FileNotFoundError) as error:  # the data source's, found reading it
        raise BadInput(f"--calibration={args.calibration}: {error}") from None
    quantize = int8.quantize_onnx if args.format == "onnx" else int8.quantize_openvino
    return quantize(model, output_path(args), images)


def main(argv: list[str] | None = None) -> int:
    """Runs the command; `argv` as `sys.argv` (the program name first). Returns the status."""
    return command_status(_export, sys.argv if argv is None else argv,
                          "nothing was exported (an earlier export is left as it was); run the "
                          "same command again")


def run() -> None:
    """Console-script entry point (`keras-efficientnet-export`)."""
    run_command(main)


if __name__ == "__main__":
    run()
