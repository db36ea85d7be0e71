"""Converts an image folder (PATH/<split>/<class>/*.jpg) into TFRecord shards `tfrecord:` reads.

Usage (installed; in a checkout `python -m keras_efficientnet.folder_to_tfrecord` is the same):
  keras-efficientnet-folder-to-tfrecord --input_dir /data/photos --output_dir /data/photos-tfrecord
  # then: make_dataset("tfrecord:/data/photos-tfrecord", "train", ...)

Each split becomes `<split>-NNNNN-of-MMMMM` shards holding the file bytes unchanged under the
standard ImageNet keys (`image/encoded`, `image/class/label` 0-based, `image/class/text`,
`image/filename`), in a seeded random order so that a record-level shuffle buffer mixes classes.
Files TensorFlow cannot decode are left out and listed. `dataset_info.json` beside the shards
records class names and split sizes, which `dataset_info("tfrecord:...")` reads.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import sys
from typing import TYPE_CHECKING

from keras_efficientnet.atomic import UnsafePathError, open_file, write_atomically
from keras_efficientnet.cli.errors import DONE, BadInput
from keras_efficientnet.cli.parser import CommandParser, command_status, run_command
from keras_efficientnet.datasets.folder_layout import split_folders

# TensorFlow and the sources (which import it) load inside the functions that use them, after
# the command's flags and input folder are checked.
if TYPE_CHECKING:
    import tensorflow as tf


def _bytes_feature(value: bytes) -> tf.train.Feature:
    import tensorflow as tf

    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int_feature(value: int) -> tf.train.Feature:
    import tensorflow as tf

    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def _readable(data: bytes) -> bool:
    import tensorflow as tf

    from keras_efficientnet.datasets import preprocessing

    try:
        preprocessing.decode(data)  # what the pipeline does with it
        return True
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        return False


def _write_shard(path: str, items: list[tuple[str, int]], class_names: list[str],
                 validate: bool) -> list[str]:
    """Writes one shard; returns the files left out as unreadable."""
    import tensorflow as tf

    from keras_efficientnet.datasets import sources

    skipped = []
    with tf.io.TFRecordWriter(path) as writer:
        for file, label in items:
            try:
                with open_file(file, "rb", links=True) as f:  # a pipe never blocks the shard
                    data = f.read()
            except UnsafePathError:  # a pipe, socket or device named like an image
                skipped.append(file)
                continue
            if validate and not _readable(data):
                skipped.append(file)
                continue
            example = tf.train.Example(features=tf.train.Features(feature={
                sources.TFRECORD_IMAGE_KEY: _bytes_feature(data),
                sources.TFRECORD_LABEL_KEY: _int_feature(label),
                "image/class/text": _bytes_feature(class_names[label].encode()),
                "image/filename": _bytes_feature(os.path.basename(file).encode()),
            }))
            writer.write(example.SerializeToString())
    return skipped


def convert(input_dir: str, output_dir: str, splits: list[str] | None = None,
            images_per_shard: int = 1024, validate: bool = True, seed: int = 0,
            workers: int = 4) -> dict:
    """Converts `splits` (default: every split folder; of a plain folder of class folders,
    `train`) and returns the dataset_info contents."""
    if images_per_shard < 1:
        raise ValueError(f"images_per_shard must be >= 1, got {images_per_shard}")
    if not os.path.isdir(input_dir):
        raise FileNotFoundError(f"input_dir {input_dir!r} does not exist")
    from keras_efficientnet.datasets import sources

    if splits is None:  # a plain folder of class folders is one split: the training split
        splits = split_folders(input_dir) or ["train"]
    os.makedirs(output_dir, exist_ok=True)
    info_path = os.path.join(output_dir, sources.TFRECORD_INFO_FILE)
    info = {"splits": {}}
    if os.path.exists(info_path):
        with open_file(info_path) as f:
            info = json.load(f)
    for split in splits:
        paths, labels, class_names = sources.list_image_folder(input_dir, split)
        if info.get("class_names", class_names) != class_names:
            raise ValueError(f"{info_path} lists classes {info['class_names']}, but "
                             f"{input_dir}/{split} has {class_names}")
        items = list(zip(paths, labels))
        random.Random(seed).shuffle(items)
        num_shards = max(1, -(-len(items) // images_per_shard))
        jobs = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            for shard in range(num_shards):
                name = f"{split}-{shard:05d}-of-{num_shards:05d}"
                jobs.append(pool.submit(_write_shard, os.path.join(output_dir, name),
                                        items[shard::num_shards], class_names, validate))
            skipped = sorted(f for job in jobs for f in job.result())
        for file in skipped:
            print(f"skipped unreadable image {file}", file=sys.stderr)
        info["class_names"] = class_names
        info["splits"][split] = {"num_examples": len(items) - len(skipped),
                                 "num_shards": num_shards, "skipped": skipped}
        print(f"{split}: {len(items) - len(skipped)} images in {num_shards} shards "
              f"({len(skipped)} skipped) -> {output_dir}")
    # Atomic: never a truncated file.
    write_atomically(info_path, json.dumps(info, indent=1, allow_nan=False))
    return info


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser("keras-efficientnet-folder-to-tfrecord", __doc__)
    parser.add_argument("--input_dir", required=True, help="folder with <split>/<class>/ images")
    parser.add_argument("--output_dir", required=True, help="where the shards are written")
    parser.add_argument("--splits", default=None,
                        help="comma-separated splits to convert (default: all split folders)")
    parser.add_argument("--images_per_shard", type=int, default=1024,
                        help="about 100 MB per shard for ImageNet-sized JPEGs")
    parser.add_argument("--no_validate", action="store_true",
                        help="skip the decode check (faster; the pipeline still skips bad files)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the record order")
    parser.add_argument("--workers", type=int, default=4, help="shards written in parallel")
    return parser


def _convert(argv: list[str]) -> int:
    args = build_parser().parse_args(argv[1:])
    try:
        convert(args.input_dir, args.output_dir,
                splits=args.splits.split(",") if args.splits else None,
                images_per_shard=args.images_per_shard, validate=not args.no_validate,
                seed=args.seed, workers=args.workers)
    except (ValueError, FileNotFoundError) as error:
        raise BadInput(str(error)) from None
    return DONE


def main(argv: list[str] | None = None) -> int:
    """Runs the command; `argv` as `sys.argv` (the program name first). Returns the status:
    bad input is one line and exit status 2 (`cli.errors`)."""
    return command_status(_convert, sys.argv if argv is None else argv)


def run() -> None:
    """Console-script entry point (`keras-efficientnet-folder-to-tfrecord`)."""
    run_command(main)


if __name__ == "__main__":
    run()
