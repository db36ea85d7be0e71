"""Inputs trusted no more than image folders are: damaged TFRecord shards and records are
skipped, named once and counted; a split of only unreadable shards is one line and exit 2; an
empty class folder is refused (or kept, with a warning, under --allow_empty_classes)."""

from __future__ import annotations

import importlib.util
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_efficientnet.datasets import SkipCounter, dataset_info, make_dataset
from tests.reliability.clitools import REPO
from tests.reliability.test_cli_errors import main  # noqa: F401 (the fixture)

pytestmark = pytest.mark.tf_only

PER_SHARD = 4
RECORD_OVERHEAD = 16  # length, its CRC, the data's CRC


def _colour_folder(root, classes=2, per_class=6):
    """PNGs whose red level says which image it is (10 * index + 5) and whose green, its class."""
    index = 0
    for split in ("train", "validation"):
        for k in range(classes):
            folder = root / split / f"class{k}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                array = np.zeros((8, 8, 3), np.uint8)
                array[..., 0], array[..., 1] = 10 * index + 5, 100 * k
                Image.fromarray(array).save(folder / f"{i}.png")
                index += 1
    return root


def _records(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "folder_to_tfrecord", os.path.join(REPO, "data", "folder_to_tfrecord.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "records"
    module.convert(str(_colour_folder(tmp_path / "photos")), str(out),
                   images_per_shard=PER_SHARD)
    return out


def _record_ends(path):
    """Byte offset where each record of an intact shard ends."""
    ends, end = [], 0
    for record in tf.data.TFRecordDataset(str(path)):
        end += len(record.numpy()) + RECORD_OVERHEAD
        ends.append(end)
    return ends


def _levels(dataset):
    images = np.concatenate([x.numpy() for x, _ in dataset])
    return sorted(images[:, 0, 0, 0].tolist())


def _level(record) -> int:
    example = tf.io.parse_single_example(
        record, {"image/encoded": tf.io.FixedLenFeature([], tf.string)})
    return int(tf.io.decode_png(example["image/encoded"])[0, 0, 0])


def test_damaged_shards_are_skipped_named_once_and_counted(tmp_path, caplog):
    out = _records(tmp_path)
    shards = sorted(out.glob("train-*"))  # 12 images in 3 shards of 4
    assert len(shards) == 3
    # Truncate shard 0 inside its third record; flip a byte in the data of shard 1's second.
    ends = [_record_ends(shard) for shard in shards]
    shards[0].write_bytes(shards[0].read_bytes()[:ends[0][1] + 20])
    data = bytearray(shards[1].read_bytes())
    data[ends[1][0] + 12 + 30] ^= 0xFF
    shards[1].write_bytes(bytes(data))
    readable = [_level(r) for s in shards for r in tf.data.TFRecordDataset(str(s)).ignore_errors()]
    assert len(readable) == 2 + 1 + 4  # what TensorFlow's reader still gets out of them

    counter = SkipCounter()
    dataset = make_dataset(f"tfrecord:{out}", "train", image_size=8, batch_size=7,
                           training=True, augment=False, repeat=True, seed=1,
                           eval_resize_ratio=1.0, skip_counter=counter)
    with caplog.at_level(logging.WARNING, logger="keras_efficientnet.datasets.pipeline"):
        levels = [v for x, _ in dataset.take(3) for v in x.numpy()[:, 0, 0, 0].tolist()]
    # Three passes over the 7 readable records: each once per pass, nothing else.
    assert sorted(levels) == sorted(readable * 3)
    assert counter.count == 2
    rest = "truncated or corrupted; the rest of the shard is skipped)"
    assert sorted(counter.names) == [
        f"{shards[0]}#2 (unreadable from byte {ends[0][1]} of {ends[0][1] + 20}: {rest}",
        f"{shards[1]}#1 (unreadable from byte {ends[1][0]} of {ends[1][-1]}: {rest}"]
    logged = [r.getMessage() for r in caplog.records if "Skipped unreadable" in r.getMessage()]
    assert len(logged) == 2  # named once, however many passes
    # Without dataset_info.json the split is counted: its readable records.
    (out / "dataset_info.json").unlink()
    assert dataset_info(f"tfrecord:{out}", "train").num_examples == 7


def test_a_split_of_only_unreadable_shards_is_refused_naming_them(tmp_path):
    out = _records(tmp_path)
    shards = sorted(out.glob("train-*"))
    for shard in shards:  # e.g. gzip-compressed copies, or the first bytes overwritten
        shard.write_bytes(b"\x1f\x8b" + shard.read_bytes()[2:])
    with pytest.raises(ValueError) as error:
        dataset_info(f"tfrecord:{out}", "train")
    assert str(error.value) == (
        f"no readable TFRecord in tfrecord:{out} (split 'train'): every shard is unreadable "
        f"from its first record ({', '.join(map(str, shards))}); expected uncompressed "
        f"TFRecord files of tf.train.Example (data/folder_to_tfrecord.py writes them)")
    # The validation shards are intact: that split still reads.
    assert dataset_info(f"tfrecord:{out}", "validation").num_examples == 12


def test_the_command_refuses_unreadable_shards_in_one_line_exit_2(tmp_path, main):  # noqa: F811
    out = _records(tmp_path)
    for shard in out.glob("train-*"):
        shard.write_bytes(b"not a record")
    status, line = main(f"--model_dir={tmp_path / 'run'}", f"--dataset=tfrecord:{out}")
    assert status == 2
    assert line.startswith(f"error: no readable TFRecord in tfrecord:{out} (split 'train'): "
                           "every shard is unreadable from its first record")


def _folder_with_empty_class(root):
    _colour_folder(root)
    (root / "train" / "class2").mkdir()
    (root / "validation" / "class2").mkdir()
    (root / "train" / "class2" / "notes.txt").write_text("not an image")
    return root


def test_an_empty_class_folder_is_refused_naming_it(tmp_path):
    root = _folder_with_empty_class(tmp_path / "photos")
    with pytest.raises(ValueError) as error:
        dataset_info(f"folder:{root}", "train")
    assert str(error.value) == (
        f"class folder {root / 'train' / 'class2'} has no images (*.jpg, *.jpeg, *.png, *.bmp, "
        f"*.gif); add images or remove the folder, or pass --allow_empty_classes to keep it as "
        f"a class with no examples")


def test_allow_empty_classes_keeps_it_as_a_class_with_a_warning(tmp_path, caplog):
    root = _folder_with_empty_class(tmp_path / "photos")
    with caplog.at_level(logging.WARNING, logger="keras_efficientnet.datasets.sources.folder"):
        info = dataset_info(f"folder:{root}", "train", allow_empty_classes=True)
        labels = np.concatenate([y.numpy() for _, y in make_dataset(
            f"folder:{root}", "validation", image_size=8, batch_size=5, training=False,
            allow_empty_classes=True)])
    assert (info.num_classes, info.num_examples) == (3, 12)
    assert info.class_names == ("class0", "class1", "class2")
    assert sorted(labels.tolist()) == [0] * 6 + [1] * 6
    warned = [r.getMessage() for r in caplog.records if "empty class folder" in r.getMessage()]
    # Once per folder, however often the split is listed.
    assert [str(root / split / "class2") in line for line in warned
            for split in ("train", "validation")].count(True) == 2
    assert len(warned) == 2


def test_the_command_refuses_an_empty_class_in_one_line_exit_2(tmp_path, main):  # noqa: F811
    root = _folder_with_empty_class(tmp_path / "photos")
    status, line = main(f"--model_dir={tmp_path / 'run'}", f"--dataset=folder:{root}")
    assert status == 2
    assert line.startswith(f"error: class folder {root / 'train' / 'class2'} has no images")


def test_the_flag_reaches_the_pipeline_options():
    from absl import flags

    from keras_efficientnet.cli.flags import define_flags
    from keras_efficientnet.training import TrainConfig
    from keras_efficientnet.training.trainer import input_options

    values = flags.FlagValues()
    define_flags(values)
    values(["train", "--allow_empty_classes"])
    assert values.allow_empty_classes is True
    assert input_options(TrainConfig(allow_empty_classes=True)).allow_empty_classes
    assert not input_options(TrainConfig()).allow_empty_classes
