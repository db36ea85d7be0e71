"""Dataset sources named by one string: synthetic, digits, folder:, tfds: and tfrecord:."""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

log = logging.getLogger(__name__)

VALID_SOURCES = "'synthetic', 'digits', 'folder:PATH', 'tfds:NAME' or 'tfrecord:PATTERN'"
_EXAMPLE_SOURCES = {
    "folder": "folder:/data/photos",
    "tfds": "tfds:imagenet2012",
    "tfrecord": "tfrecord:/data/imagenet-tfrecords",
}
# Files an image folder may hold (compared lower-case); anything else in it is not listed.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")

# Overrides the default root of generated data (the `digits` folder), like `data_dir` does.
DATA_DIR_ENV = "KERAS_EFFICIENTNET_DATA_DIR"
DIGITS_SIZE = 32  # 8x8 scikit-learn digits upscaled 4x (nearest), so small models can stride.
DIGITS_VALIDATION_EVERY = 5  # every 5th image of each class -> validation: a fixed 80/20 split.
_COMPLETE_MARKER = ".complete"

SYNTHETIC_EXAMPLES = {"train": 4096, "validation": 1024}
SYNTHETIC_NUM_CLASSES = 1000
# Distinct random images cycled through: enough to look like data, cheap enough to cache.
SYNTHETIC_POOL = 64

# Seed of the fixed order in which unshuffled (evaluation) reads list an image folder.
EVAL_ORDER_SEED = 20210607

TFRECORD_IMAGE_KEY = "image/encoded"
TFRECORD_LABEL_KEY = "image/class/label"
# Object boxes of TF-slim style ImageNet records (normalized; absent keys read as no boxes).
TFRECORD_BOX_KEYS = tuple(f"image/object/bbox/{k}" for k in ("ymin", "xmin", "ymax", "xmax"))
# Written next to TFRecord shards by data/folder_to_tfrecord.py: class names and split sizes.
TFRECORD_INFO_FILE = "dataset_info.json"


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a trainer needs before reading: split size (for steps per epoch) and classes.

    Args:
      source: the source string it describes.
      split: the split name.
      num_examples: examples in the split (for image folders, files listed, before any bad file
        is skipped).
      num_classes: number of classes, or None where the source does not record it.
      class_names: class names in label order, or None where unknown.
    """

    source: str
    split: str
    num_examples: int
    num_classes: int | None
    class_names: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Records:
    """A split opened for reading, before decoding.

    `dataset` yields dicts `{"name": file name or record id, "data": file path or encoded
    bytes, "label": int32}`, or `{"image": uint8, "label": int32}` when `decoded` (synthetic).
    Sources that carry object boxes add `"boxes"`: a `tf.io.serialize_tensor` of float32
    `[N, 4]` normalized `[ymin, xmin, ymax, xmax]` (serialized, so that records with different
    N batch together), which the training crop must overlap. `sharded` says the reader already
    split its files between input pipelines.
    """

    dataset: tf.data.Dataset
    info: DatasetInfo
    data_is_path: bool = False
    decoded: bool = False
    sharded: bool = False


def parse_source(source: str) -> tuple[str, str]:
    """Splits `'kind:argument'` into `(kind, argument)`; checks the kind."""
    if not isinstance(source, str) or not source:
        raise ValueError(f"dataset source must be a non-empty string, got {source!r}; "
                         f"valid: {VALID_SOURCES}")
    kind, _, argument = source.partition(":")
    if kind in ("synthetic", "digits"):
        if argument:
            raise ValueError(f"source {kind!r} takes no argument, got {source!r}")
        return kind, ""
    if kind in ("folder", "tfds", "tfrecord"):
        if not argument:
            raise ValueError(f"source {source!r} needs an argument after the colon, "
                             f"e.g. {_EXAMPLE_SOURCES[kind]!r}; valid: {VALID_SOURCES}")
        return kind, argument
    raise ValueError(f"unknown dataset source {source!r}; valid: {VALID_SOURCES}")


# ---------------------------------------------------------------------------- image folders


def _class_folders(split_dir: Path) -> list[str]:
    return sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())


def list_image_folder(root: str | os.PathLike,
                      split: str) -> tuple[list[str], list[int], list[str]]:
    """Lists `root/<split>/<class>/**/*.jpg|png|...` as (paths, labels, class names).

    Labels index the sorted class folder names. Every other split folder under `root` that has
    class folders must have the same ones.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist; expected the layout "
                                f"{root}/<split>/<class>/*.jpg (or .png)")
    splits = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    split_dir = root / split
    if not split_dir.is_dir():
        raise ValueError(f"split {split!r} not found in image folder {str(root)!r}; "
                         f"available splits: {splits}")
    classes = _class_folders(split_dir)
    if not classes:
        raise ValueError(f"split {split!r} of {str(root)!r} has no class folders; expected "
                         f"{split_dir}/<class>/*.jpg")
    for other in splits:
        other_classes = _class_folders(root / other) if other != split else classes
        if other_classes and other_classes != classes:
            only_here = sorted(set(classes) - set(other_classes))
            only_there = sorted(set(other_classes) - set(classes))
            raise ValueError(
                f"class folders differ between splits of {str(root)!r}: only in {split!r}: "
                f"{only_here}; only in {other!r}: {only_there}. Every split needs the same class "
                f"folders so that labels mean the same thing")
    paths, labels = [], []
    for label, name in enumerate(classes):
        for directory, subdirs, files in os.walk(split_dir / name):
            subdirs.sort()  # os.walk visits in this order: keeps the listing deterministic.
            for file in sorted(files):
                if file.lower().endswith(IMAGE_EXTENSIONS):
                    paths.append(os.path.join(directory, file))
                    labels.append(label)
    if not paths:
        raise ValueError(f"split {split!r} of {str(root)!r} has no images "
                         f"({', '.join('*' + e for e in IMAGE_EXTENSIONS)}) in its "
                         f"{len(classes)} class folders")
    return paths, labels, classes


def _folder_records(root: str | os.PathLike, split: str, source: str,
                    sample_order: bool = False) -> Records:
    paths, labels, classes = list_image_folder(root, split)
    info = DatasetInfo(source, split, len(paths), len(classes), tuple(classes))
    if sample_order:
        # The listing is sorted by class: its first N files are one or two classes. A fixed
        # permutation makes every prefix (what --eval_steps reads) a uniform random sample,
        # the same in every run.
        order = np.random.default_rng(EVAL_ORDER_SEED).permutation(len(paths))
        paths, labels = [paths[i] for i in order], [labels[i] for i in order]
    dataset = tf.data.Dataset.from_tensor_slices(
        {"name": paths, "data": paths, "label": np.asarray(labels, np.int32)}
    )
    return Records(dataset, info, data_is_path=True)


# ---------------------------------------------------------------------------- digits


def default_data_dir() -> Path:
    """Root for generated data: $KERAS_EFFICIENTNET_DATA_DIR, else `<repo>/data` when this is a
    writable source checkout, else `~/.cache/keras_efficientnet`."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    repo = Path(__file__).resolve().parents[2]
    data = repo / "data"
    if (repo / "setup.cfg").is_file() and data.is_dir() and os.access(data, os.W_OK):
        return data
    return Path.home() / ".cache" / "keras_efficientnet"


def _write_digits(root: Path) -> None:
    try:
        from PIL import Image
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(f"the 'digits' dataset needs scikit-learn and pillow ({error}); "
                          "pip install 'keras-efficientnet[digits]'") from None

    digits = load_digits()
    # Values are ink counts 0..16: stretch to 0..255 and repeat to RGB so the folder reader sees
    # an ordinary colour image.
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    scale = DIGITS_SIZE // images.shape[1]
    seen_per_class = np.zeros(10, np.int64)
    for index, (image, label) in enumerate(zip(images, digits.target)):
        split = "validation" if seen_per_class[label] % DIGITS_VALIDATION_EVERY == (
            DIGITS_VALIDATION_EVERY - 1) else "train"
        seen_per_class[label] += 1
        big = np.kron(image, np.ones((scale, scale), np.uint8))
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.stack([big] * 3, axis=-1)).save(folder / f"{index:04d}.png")


def prepare_digits(data_dir: str | os.PathLike | None = None) -> Path:
    """Writes scikit-learn's 1797 8x8 digits once as `<data_dir>/digits/{train,validation}/<d>/`
    PNGs and returns that folder; later calls return at once.

    Written into a temporary sibling and renamed into place, so an interrupted write never
    leaves a half folder and concurrent writers are harmless.
    """
    root = Path(data_dir if data_dir is not None else default_data_dir()) / "digits"
    if (root / _COMPLETE_MARKER).is_file():
        return root
    if root.exists():
        raise FileExistsError(f"{root} exists but is not a complete digits folder (no "
                              f"{_COMPLETE_MARKER} marker); delete it and it will be rewritten")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".digits-", dir=root.parent))
    try:
        _write_digits(staging)
        (staging / _COMPLETE_MARKER).write_text("scikit-learn load_digits, 80/20 split\n")
        try:
            os.rename(staging, root)
        except OSError:
            if not (root / _COMPLETE_MARKER).is_file():  # lost a race to a complete writer: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


# ---------------------------------------------------------------------------- tfds


def _tfds_builder(name: str, data_dir: str | os.PathLike | None):
    import tensorflow_datasets as tfds  # heavy import: only for this source

    try:
        builder = tfds.builder(name, data_dir=None if data_dir is None else os.fspath(data_dir))
    except tfds.core.registered.DatasetNotFoundError:
        close = difflib.get_close_matches(name, tfds.list_builders(), n=5, cutoff=0.6)
        raise ValueError(f"unknown tensorflow-datasets name {name!r}; close matches: {close} "
                         f"(tfds.list_builders() lists all)") from None
    if not builder.is_prepared():
        raise FileNotFoundError(
            f"tfds dataset {name!r} is not prepared in {builder.data_dir!r}; prepare it with "
            f"`tfds build {name} --data_dir=DIR` (ImageNet needs its manual dir: see "
            f"data/README.md) and pass data_dir=DIR")
    return builder


def _tfds_keys(builder) -> tuple[str, str]:
    import tensorflow_datasets as tfds

    features = builder.info.features
    images = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    labels = [k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)]
    if not images or not labels:
        raise ValueError(f"tfds dataset {builder.name!r} is not an image classification dataset: "
                         f"features {sorted(features.keys())}; need an Image and a ClassLabel")
    return ("image" if "image" in images else images[0]), (
        "label" if "label" in labels else labels[0])


def _tfds_box_path(builder) -> tuple[str, ...] | None:
    """Where a tfds dataset keeps normalized object boxes (a BBoxFeature at the top level or in
    a Sequence such as "objects"), or None. tfds' imagenet2012 has none."""
    import tensorflow_datasets as tfds

    for key, feature in builder.info.features.items():
        if isinstance(feature, tfds.features.BBoxFeature):
            return (key,)
        inner = getattr(feature, "feature", None)
        if isinstance(feature, tfds.features.Sequence) and hasattr(inner, "items"):
            for sub, sub_feature in inner.items():
                if isinstance(sub_feature, tfds.features.BBoxFeature):
                    return (key, sub)
    return None


def _serialized_boxes(boxes: tf.Tensor) -> tf.Tensor:
    return tf.io.serialize_tensor(tf.reshape(tf.cast(boxes, tf.float32), [-1, 4]))


def _tfds_split_size(builder, split: str) -> int:
    try:
        return int(builder.info.splits[split].num_examples)
    except (KeyError, ValueError, AssertionError):
        raise ValueError(f"split {split!r} not in tfds dataset {builder.name!r}; available: "
                         f"{sorted(builder.info.splits.keys())}") from None


def _tfds_info(name: str, split: str, data_dir, source: str) -> DatasetInfo:
    builder = _tfds_builder(name, data_dir)
    _, label_key = _tfds_keys(builder)
    names = tuple(builder.info.features[label_key].names)
    return DatasetInfo(source, split, _tfds_split_size(builder, split), len(names), names)


def _tfds_records(name, split, data_dir, source, input_context, shuffle_files, seed) -> Records:
    import tensorflow_datasets as tfds

    builder = _tfds_builder(name, data_dir)
    image_key, label_key = _tfds_keys(builder)
    names = tuple(builder.info.features[label_key].names)
    info = DatasetInfo(source, split, _tfds_split_size(builder, split), len(names), names)
    read_config = tfds.ReadConfig(
        input_context=input_context,  # tfds shards by file: each worker reads only its files
        shuffle_seed=seed,
        add_tfds_id=True,  # a record id to name a bad image by
        try_autocache=False,  # the pipeline's own `cache` decides
    )
    dataset = builder.as_dataset(
        split=split,
        shuffle_files=shuffle_files,
        # Keep the bytes encoded: the pipeline decodes only the crop window.
        decoders={image_key: tfds.decode.SkipDecoding()},
        read_config=read_config,
    )
    has_file_name = "file_name" in builder.info.features
    box_path = _tfds_box_path(builder)

    def record(e):
        out = {"name": e["file_name"] if has_file_name else e["tfds_id"], "data": e[image_key],
               "label": tf.cast(e[label_key], tf.int32)}
        if box_path is not None:
            boxes = e
            for key in box_path:
                boxes = boxes[key]
            out["boxes"] = _serialized_boxes(boxes)
        return out

    dataset = dataset.map(record, num_parallel_calls=tf.data.AUTOTUNE)
    return Records(dataset, info, sharded=input_context is not None)


# ---------------------------------------------------------------------------- TFRecord


def tfrecord_files(pattern: str, split: str) -> list[str]:
    """The sorted files of `split`: `pattern` with `{split}` filled in, `pattern/<split>-*` when
    `pattern` is a directory, else the glob `pattern` itself."""
    if "{split}" in pattern:
        glob = pattern.replace("{split}", split)
    elif tf.io.gfile.isdir(pattern):
        glob = os.path.join(pattern, f"{split}-*")
    else:
        glob = pattern
    files = sorted(tf.io.gfile.glob(glob))
    if not files:
        raise FileNotFoundError(
            f"no TFRecord files match {glob!r} (source 'tfrecord:{pattern}', split {split!r}); "
            f"give a directory holding {split}-* shards, a glob, or a pattern with '{{split}}'")
    return files


def _tfrecord_info(pattern: str, split: str, source: str) -> DatasetInfo:
    files = tfrecord_files(pattern, split)
    sidecar = os.path.join(os.path.dirname(files[0]), TFRECORD_INFO_FILE)
    if tf.io.gfile.exists(sidecar):
        with tf.io.gfile.GFile(sidecar) as f:
            meta = json.load(f)
        names = meta.get("class_names")
        if split in meta.get("splits", {}):
            count = int(meta["splits"][split]["num_examples"])
            return DatasetInfo(source, split, count, len(names) if names else None,
                               tuple(names) if names else None)
    log.warning("No %s beside %s: counting the records of %d files (reads them all)",
                TFRECORD_INFO_FILE, files[0], len(files))
    count = int(tf.data.TFRecordDataset(files).reduce(np.int64(0), lambda n, _: n + 1))
    return DatasetInfo(source, split, count, None, None)


def _tfrecord_records(pattern, split, source, input_context, shuffle_files, seed,
                      label_offset) -> Records:
    files = tfrecord_files(pattern, split)
    info = _tfrecord_info(pattern, split, source)
    dataset = tf.data.Dataset.from_tensor_slices(files)
    sharded = False
    if input_context is not None and len(files) >= input_context.num_input_pipelines:
        # Shard files, not records, so that each worker reads only its own files.
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
        sharded = True
    if shuffle_files:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)

    def read_file(path):
        records = tf.data.TFRecordDataset(path, buffer_size=8 << 20)
        return records.enumerate().map(
            lambda i, record: (tf.strings.join([path, "#", tf.strings.as_string(i)]), record))

    dataset = dataset.interleave(read_file, cycle_length=min(len(files), 16),
                                 num_parallel_calls=tf.data.AUTOTUNE)
    features = {
        TFRECORD_IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        TFRECORD_LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
        **{key: tf.io.VarLenFeature(tf.float32) for key in TFRECORD_BOX_KEYS},
    }

    def parse(name, record):
        example = tf.io.parse_single_example(record, features)
        label = tf.cast(example[TFRECORD_LABEL_KEY] - label_offset, tf.int32)
        boxes = tf.stack([example[key].values for key in TFRECORD_BOX_KEYS], axis=1)
        return {"name": name, "data": example[TFRECORD_IMAGE_KEY], "label": label,
                "boxes": _serialized_boxes(boxes)}

    dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return Records(dataset, info, sharded=sharded)


# ---------------------------------------------------------------------------- synthetic


def _synthetic_size(split: str) -> int:
    if split not in SYNTHETIC_EXAMPLES:
        raise ValueError(f"split {split!r} not in source 'synthetic'; available: "
                         f"{sorted(SYNTHETIC_EXAMPLES)}")
    return SYNTHETIC_EXAMPLES[split]


def _synthetic_records(split, source, image_size, num_classes, seed) -> Records:
    count = _synthetic_size(split)
    num_classes = num_classes or SYNTHETIC_NUM_CLASSES
    seed = 0 if seed is None else seed
    pool = tf.data.Dataset.range(SYNTHETIC_POOL).map(
        lambda i: tf.cast(tf.random.stateless_uniform(
            [image_size, image_size, 3], tf.stack([tf.constant(seed, tf.int64), i]),
            minval=0, maxval=256, dtype=tf.int32), tf.uint8))
    labels = tf.data.Dataset.range(count).map(
        lambda i: tf.random.stateless_uniform(
            [], tf.stack([tf.constant(seed + 1, tf.int64), i]), minval=0, maxval=num_classes,
            dtype=tf.int32))
    dataset = tf.data.Dataset.zip(pool.cache().repeat(), labels).map(
        lambda image, label: {"image": image, "label": label})
    info = DatasetInfo(source, split, count, num_classes, None)
    return Records(dataset, info, decoded=True)


# ---------------------------------------------------------------------------- entry points


def dataset_info(
    source: str,
    split: str,
    data_dir: str | os.PathLike | None = None,
    num_classes: int | None = None,
) -> DatasetInfo:
    """Size and classes of `split` of `source`, without building a pipeline.

    Example:
      >>> info = dataset_info("digits", "train")
      >>> steps_per_epoch = info.num_examples // batch_size
    """
    kind, argument = parse_source(source)
    if kind == "synthetic":
        return DatasetInfo(source, split, _synthetic_size(split),
                           num_classes or SYNTHETIC_NUM_CLASSES, None)
    if kind == "digits":
        paths, _, classes = list_image_folder(prepare_digits(data_dir), split)
        return DatasetInfo(source, split, len(paths), len(classes), tuple(classes))
    if kind == "folder":
        paths, _, classes = list_image_folder(argument, split)
        return DatasetInfo(source, split, len(paths), len(classes), tuple(classes))
    if kind == "tfds":
        return _tfds_info(argument, split, data_dir, source)
    info = _tfrecord_info(argument, split, source)
    if info.num_classes is None and num_classes is not None:
        info = dataclasses.replace(info, num_classes=num_classes)
    return info


def read_records(
    source: str,
    split: str,
    *,
    data_dir: str | os.PathLike | None = None,
    input_context: tf.distribute.InputContext | None = None,
    shuffle_files: bool = False,
    seed: int | None = None,
    image_size: int = 224,
    num_classes: int | None = None,
    label_offset: int = 0,
) -> Records:
    """Opens `split` of `source` for the pipeline (see `Records`); checks it exists first.

    Unshuffled reads (`shuffle_files=False`, evaluation) of image folders come in a fixed
    random order rather than sorted by class, so that reading only the first batches samples
    every class; tfds and TFRecord splits keep the order they were written in (shuffled at
    preparation: data/folder_to_tfrecord.py and tfds both do).
    """
    kind, argument = parse_source(source)
    if kind == "synthetic":
        return _synthetic_records(split, source, image_size, num_classes, seed)
    if kind == "digits":
        return _folder_records(prepare_digits(data_dir), split, source,
                               sample_order=not shuffle_files)
    if kind == "folder":
        return _folder_records(argument, split, source, sample_order=not shuffle_files)
    if kind == "tfds":
        return _tfds_records(argument, split, data_dir, source, input_context, shuffle_files,
                             seed)
    return _tfrecord_records(argument, split, source, input_context, shuffle_files, seed,
                             label_offset)
