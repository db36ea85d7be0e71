"""`tfds:NAME`: a prepared tensorflow-datasets image classification dataset, kept encoded."""

from __future__ import annotations

import difflib
import os

import tensorflow as tf

from keras_efficientnet.datasets.sources.base import (
    DatasetInfo,
    Reader,
    Records,
    serialized_boxes,
)


def _builder(name: str, data_dir: str | os.PathLike | None):
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


def _keys(builder) -> tuple[str, str]:
    import tensorflow_datasets as tfds

    features = builder.info.features
    images = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    labels = [k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)]
    if not images or not labels:
        raise ValueError(f"tfds dataset {builder.name!r} is not an image classification dataset: "
                         f"features {sorted(features.keys())}; need an Image and a ClassLabel")
    return ("image" if "image" in images else images[0]), (
        "label" if "label" in labels else labels[0])


def box_path(builder) -> tuple[str, ...] | None:
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


def _split_size(builder, split: str) -> int:
    try:
        return int(builder.info.splits[split].num_examples)
    except (KeyError, ValueError, AssertionError):
        raise ValueError(f"split {split!r} not in tfds dataset {builder.name!r}; available: "
                         f"{sorted(builder.info.splits.keys())}") from None


def _record_fn(builder, image_key: str, label_key: str):
    has_file_name = "file_name" in builder.info.features
    boxes_at = box_path(builder)

    def record(e):
        out = {"name": e["file_name"] if has_file_name else e["tfds_id"], "data": e[image_key],
               "label": tf.cast(e[label_key], tf.int32)}
        if boxes_at is not None:
            boxes = e
            for key in boxes_at:
                boxes = boxes[key]
            out["boxes"] = serialized_boxes(boxes)
        return out

    return record


class TfdsReader(Reader):
    """Reads `tfds:NAME` from `data_dir` (tfds' default when None); tfds shards by file, so each
    worker reads only its own files."""

    def _info(self, builder, split: str) -> DatasetInfo:
        _, label_key = _keys(builder)
        names = tuple(builder.info.features[label_key].names)
        return DatasetInfo(self.source, split, _split_size(builder, split), len(names), names)

    def info(self, split: str) -> DatasetInfo:
        return self._info(_builder(self.argument, self.data_dir), split)

    def records(self, split, *, input_context=None, shuffle_files=False, seed=None,
                image_size=224) -> Records:
        import tensorflow_datasets as tfds

        builder = _builder(self.argument, self.data_dir)
        info = self._info(builder, split)
        image_key, label_key = _keys(builder)
        read_config = tfds.ReadConfig(
            input_context=input_context,  # tfds shards by file: each worker reads its files
            shuffle_seed=seed,
            add_tfds_id=True,  # a record id to name a bad image by
            try_autocache=False,  # the pipeline's own `cache` decides
        )
        dataset = builder.as_dataset(
            split=split, shuffle_files=shuffle_files, read_config=read_config,
            # Keep the bytes encoded: the pipeline decodes only the crop window.
            decoders={image_key: tfds.decode.SkipDecoding()})
        dataset = dataset.map(_record_fn(builder, image_key, label_key),
                              num_parallel_calls=tf.data.AUTOTUNE)
        return Records(dataset, info, sharded=input_context is not None)
