"""`keras-efficientnet-export SOURCE --output=PATH`: a trained model as a serving artifact.

SOURCE is a run directory (its final model, `model.keras`) or a `.keras` file. `--format`
chooses the artifact; today's one is `saved_model`: a TensorFlow SavedModel whose
`serving_default` signature takes uint8 images `[batch, height, width, 3]` and returns class
probabilities, written as `--export_dir` writes it at the end of training
(`training.export.export_saved_model`: atomic, and an earlier export of ours at PATH is
replaced whole while a folder holding anything else is refused).

SOURCE, the model file and PATH are checked before TensorFlow loads; each failure is one line.
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
FORMATS = ("saved_model",)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("keras-efficientnet-export", __doc__)
    parser.add_argument("source", metavar="SOURCE", help="a run directory (its model.keras) or "
                        "a .keras model file")
    parser.add_argument("--output", default="", help="the folder to write (required); an "
                        "earlier export there is replaced")
    parser.add_argument("--format", default="saved_model", choices=FORMATS,
                        help="what to write: saved_model = TensorFlow SavedModel")
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


def _check(args) -> Path:
    model = model_file_of(args.source)
    check_model_file(str(model), flag="SOURCE")
    if not args.output:
        raise BadInput("--output is required: the folder to write, e.g. "
                       "--output=runs/default/saved_model")
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

    quiet.import_tensorflow(verbose=args.verbosity > 0)
    from keras_efficientnet.registration import load_model
    from keras_efficientnet.training.export import export_saved_model

    try:  # registers the package's classes with Keras first
        model = load_model(model_file)
    except Exception as error:  # a damaged zip, unknown classes: one line, not Keras' report
        raise BadInput(f"{model_file}: Keras cannot load this model "
                       f"({errors.one_line(error)})") from None
    try:
        written = export_saved_model(model, args.output)
    except Exception as error:  # a refused write (RUN_FAILED), a bad path (BAD_INPUT)
        described = errors.describe(error)
        if described is None:
            raise
        print(described[0], file=sys.stderr, flush=True)
        return described[1]
    print(f"wrote {args.format} {written} from {model_file} (serving_default: uint8 images "
          f"{tuple(model.inputs[0].shape)} in, probabilities out)")
    return DONE


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
