"""`keras-efficientnet-evaluate --model_file=PATH.keras --dataset=SOURCE`: top-1, top-5, loss and
images/s of a saved model on a held-out split (timm's validate.py for this project).

The split is read as training runs evaluate it (decode, resize the short side to
`resolution x 256/224`, centre crop, uint8); the model's output is taken as probabilities (what
every `.keras` a run writes emits); images/s counts the whole `evaluate` call, its first-batch
tracing included. The flags and paths are checked before TensorFlow loads.
To score a run directory with its own configuration use
`keras-efficientnet-train --mode=evaluate --model_dir=RUN`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from keras_efficientnet.cli.errors import BadInput
from keras_efficientnet.cli.parser import (
    CommandParser,
    add_verbosity,
    check_model_file,
    command_status,
    model_file,
    run_command,
)
from keras_efficientnet.cli.summary import images_phrase
from keras_efficientnet.datasets.options import HoldOut
from keras_efficientnet.datasets.source_table import local_folder_problem


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("keras-efficientnet-evaluate", __doc__)
    parser.add_argument("--model_file", help="a .keras model file (required; --model is its "
                        "deprecated spelling)")
    parser.add_argument("--dataset", default="digits", help="digits, fashion_mnist, "
                        "synthetic, folder:PATH, tfds:NAME or tfrecord:PATTERN")
    parser.add_argument("--data_dir", default="", help="data directory of the source")
    parser.add_argument("--eval_split", default="validation", help="the split to score "
                        "(--split is its deprecated spelling)")
    parser.add_argument("--validation_split", type=float, default=None, help="an image folder "
                        "without a held-out split: score the share of each class of "
                        "--train_split that training held out with this --validation_split; "
                        "default: the run's own, where the model file sits in a run "
                        "directory (its config.json) of the same --dataset, else none")
    parser.add_argument("--train_split", default=None, help="the split --validation_split "
                        "holds out of (default: the run's, else train)")
    parser.add_argument("--resolution", type=int, default=0, help="0 = the model's")
    parser.add_argument("--batch_size", type=int, default=32, help="images per batch")
    parser.add_argument("--steps", type=int, default=0, help="batches to score; 0 = all")
    add_verbosity(parser)
    return parser


def hold_out(args) -> HoldOut | None:
    """The hold-out to score (`--validation_split`, else the run's beside the model file);
    BadInput for a fraction outside [0, 1)."""
    fraction, pool = args.validation_split, args.train_split
    if fraction is None or pool is None:
        # An unreadable config.json is an error only where it would decide the hold-out.
        saved = _run_settings(args.model_file, args.dataset, strict=fraction is None)
        fraction = saved.get("validation_split", 0.0) if fraction is None else fraction
        pool = pool or saved.get("train_split") or "train"
    if not fraction:
        return None
    try:
        return HoldOut(fraction, pool)
    except ValueError as error:
        raise BadInput(str(error)) from None


def _run_settings(model_file: str | None, dataset: str, strict: bool = True) -> dict:
    """The config of the run whose directory holds `model_file` (its config.json), where that
    run read `dataset`; else {}. BadInput naming the file when it is there but cannot be read
    (`strict`; else {})."""
    from keras_efficientnet.runs.record import RecordError
    from keras_efficientnet.training.run_config import read_run_config

    if not model_file:
        return {}
    try:
        record = read_run_config(Path(model_file).parent)
    except (RecordError, OSError, ValueError) as error:
        if not strict:
            return {}
        # Ignored, the hold-out would silently be left out (the held-out images scored with
        # the ones the run trained on, or none of them).
        raise BadInput(f"{str(error).split('; delete it')[0]}: the run's --validation_split "
                       "cannot be read from it; fix or remove it, or give --validation_split "
                       "(0 for none)") from None
    saved = (record or {}).get("config", {})
    return saved if saved.get("dataset") == dataset else {}


def _check(args) -> None:
    args.model_file = model_file(args.model_file)  # a run RUN[:final|best]: its .keras file
    check_model_file(args.model_file)
    for name, low in (("batch_size", 1), ("steps", 0), ("resolution", 0)):
        if getattr(args, name) < low:
            raise BadInput(f"--{name}={getattr(args, name)}: must be at least {low}")
    args.hold_out = hold_out(args)
    try:
        problem = local_folder_problem(args.dataset, (args.eval_split,), args.hold_out)
    except ValueError as error:  # an unknown kind or a missing argument
        raise BadInput(f"--dataset: {error}") from None
    if problem:
        raise BadInput(f"--dataset={args.dataset}: {problem}")


def score(model, dataset, batches: int) -> dict:
    """top1, top5, loss, images and images/s of `model` (probabilities out) on the first
    `batches` batches of `dataset`, in one pass (`batches` tells Keras where it ends; the images
    are those the metrics saw, so a skipped unreadable file is not counted)."""
    import keras

    top1 = keras.metrics.SparseCategoricalAccuracy(name="top1")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=[top1, keras.metrics.SparseTopKCategoricalAccuracy(5, name="top5")],
                  jit_compile=False)
    start = time.perf_counter()
    results = model.evaluate(dataset, steps=batches, verbose=0, return_dict=True)
    seconds = time.perf_counter() - start
    images = int(keras.ops.convert_to_numpy(top1.count))
    return {"top1": float(results["top1"]), "top5": float(results["top5"]),
            "loss": float(results["loss"]), "images": images,
            "images_per_second": images / seconds}


def _run(args) -> dict:
    from keras_efficientnet.cli import quiet

    print(f"loading: TensorFlow, then {args.model_file}", flush=True)  # seconds of silence else
    quiet.import_tensorflow(verbose=args.verbosity > 0)
    from keras_efficientnet import datasets
    from keras_efficientnet.registration import load_model

    model = load_model(args.model_file)  # registers the package's classes with Keras first
    resolution = args.resolution or model.input_shape[1]
    if resolution is None:
        raise BadInput(f"{args.model_file} takes any resolution; give --resolution")
    options = datasets.InputOptions(
        source=args.dataset, split=args.eval_split, image_size=resolution,
        batch_size=args.batch_size, training=False, augment=False, mix=False, repeat=False,
        data_dir=args.data_dir or None, num_classes=model.output_shape[-1],
        hold_out=args.hold_out)
    examples = datasets.dataset_info(options.source, options.split, data_dir=options.data_dir,
                                     num_classes=options.num_classes,
                                     hold_out=options.hold_out).num_examples
    batches = -(-examples // args.batch_size)  # the last one partial
    scores = score(model, datasets.make_dataset(options),
                   min(batches, args.steps) if args.steps else batches)
    return {**scores, "examples": examples}


def _evaluate(argv: list[str]) -> int:
    args = build_parser().parse_args(argv[1:])
    _check(args)
    try:
        result = _run(args)
    except (ValueError, FileNotFoundError) as error:  # the data source's, found reading it
        raise BadInput(str(error)) from None
    held = (f", held out of {args.hold_out.pool} by --validation_split="
            f"{args.hold_out.fraction:g}" if args.hold_out else "")
    covered = images_phrase(result["images"], result["examples"], args.eval_split,
                            f"--steps={args.steps} of --batch_size={args.batch_size}")
    print(f"{args.model_file} on {args.dataset} ({args.eval_split}{held}): "
          f"top-1 {result['top1']:.4f} {covered}; "
          f"top-5 {result['top5']:.4f}  loss {result['loss']:.4f}  "
          f"{result['images_per_second']:.1f} images/s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Runs the command; `argv` as `sys.argv` (the program name first). Returns the status."""
    return command_status(_evaluate, sys.argv if argv is None else argv,
                          "nothing was scored; run the same command again")


def run() -> None:
    """Console-script entry point (`keras-efficientnet-evaluate`)."""
    run_command(main)


if __name__ == "__main__":
    run()
