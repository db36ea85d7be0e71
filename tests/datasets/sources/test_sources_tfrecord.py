"""`tfrecord:PATTERN`: folder_to_tfrecord round trip, patterns, sharding, object boxes."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.datasets import dataset_info, make_dataset, sources

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def collect(dataset):
    pairs = [(x.numpy(), y.numpy()) for x, y in dataset]
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def load_cli():
    spec = importlib.util.spec_from_file_location(
        "folder_to_tfrecord", os.path.join(REPO, "data", "folder_to_tfrecord.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_folder_to_tfrecord_round_trip(folder, tmp_path, capsys):
    bad = os.path.join(folder.root, "train", "dog", "broken.jpg")
    with open(bad, "wb") as f:
        f.write(b"\xff\xd8 broken")
    out = str(tmp_path / "records")
    assert load_cli().main(["folder_to_tfrecord", "--input_dir", folder.root, "--output_dir",
                            out, "--images_per_shard", "5"]) == 0
    assert "skipped unreadable image" in capsys.readouterr().err
    with open(os.path.join(out, sources.TFRECORD_INFO_FILE)) as f:
        meta = json.load(f)
    assert meta["splits"]["train"]["skipped"] == [bad]
    assert min(os.listdir(out)) == "dataset_info.json"
    assert len(tf.io.gfile.glob(os.path.join(out, "train-*"))) == 3  # 12 images / 5 per shard

    info = dataset_info(f"tfrecord:{out}", "train")
    assert (info.num_examples, info.num_classes) == (12, 3)
    assert info.class_names == ("cat", "dog", "owl")
    for split in ("train", "validation"):
        images, labels = collect(make_dataset(f"tfrecord:{out}", split, image_size=8,
                                              batch_size=5, training=False))
        index = folder.identify(split, images)
        assert sorted(index) == list(range(len(folder.items[split])))
        np.testing.assert_array_equal(labels, folder.labels(split)[index])


def test_a_plain_folder_of_class_folders_converts_as_the_training_split(folder, tmp_path,
                                                                       capsys):
    classes = os.path.join(folder.root, "train")  # cat/, dog/, owl/: no split folders
    out = str(tmp_path / "records")
    assert load_cli().main(["folder_to_tfrecord", "--input_dir", classes, "--output_dir", out,
                            "--images_per_shard", "100"]) == 0
    assert capsys.readouterr().out.startswith("train: 12 images in 1 shards")
    info = dataset_info(f"tfrecord:{out}", "train")
    assert (info.num_examples, info.class_names) == (12, ("cat", "dog", "owl"))


def test_without_dataset_info_a_split_is_counted_once_until_a_shard_changes(folder, tmp_path,
                                                                            caplog):
    out = tmp_path / "records"
    load_cli().convert(folder.root, str(out), splits=["train"], images_per_shard=5)
    (out / sources.TFRECORD_INFO_FILE).unlink()
    source = f"tfrecord:{out}"
    with caplog.at_level("WARNING", logger="keras_efficientnet.datasets.sources.tfrecord"):
        assert dataset_info(source, "train", num_classes=3).num_examples == 12
        images, _ = collect(make_dataset(source, "train", image_size=8, batch_size=5,
                                         training=False, num_classes=3))
        assert len(images) == 12
        counted = [r for r in caplog.records if "counting the records" in r.getMessage()]
        assert len(counted) == 1  # the size, then the read: one count
        shards = sorted(out.glob("train-*"))  # 5 + 4 + 3 records, in some order
        removed = sum(1 for _ in tf.data.TFRecordDataset(str(shards[0])))
        shards[0].unlink()
        assert dataset_info(f"tfrecord:{out}/train-*", "train").num_examples == 12 - removed
        assert len([r for r in caplog.records if "counting the records" in r.getMessage()]) == 2


def test_a_refused_write_leaves_the_previous_dataset_info_whole(folder, tmp_path,
                                                                 monkeypatch):
    import errno

    from keras_efficientnet import atomic

    out = tmp_path / "records"
    cli = load_cli()
    cli.convert(folder.root, str(out), splits=["validation"], images_per_shard=100)
    before = (out / sources.TFRECORD_INFO_FILE).read_text()

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", full)  # the disk fills at the rename
    with pytest.raises(OSError, match="No space left on device"):
        cli.convert(folder.root, str(out), splits=["train"], images_per_shard=100)
    assert (out / sources.TFRECORD_INFO_FILE).read_text() == before
    assert json.loads(before)["splits"].keys() == {"validation"}
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


def test_tfrecord_patterns_and_label_offset(folder, tmp_path):
    out = str(tmp_path / "records")
    load_cli().convert(folder.root, out, splits=["validation"], images_per_shard=100)
    by_glob = collect(make_dataset(f"tfrecord:{out}/validation-*", "validation", image_size=8,
                                   batch_size=6, training=False, label_offset=1))
    by_split = collect(make_dataset(f"tfrecord:{out}/{{split}}-*", "validation", image_size=8,
                                    batch_size=6, training=False))
    order = [np.argsort(folder.identify("validation", run[0])) for run in (by_glob, by_split)]
    np.testing.assert_array_equal(by_glob[1][order[0]] + 1, by_split[1][order[1]])
    with pytest.raises(FileNotFoundError, match="no TFRecord files match"):
        make_dataset(f"tfrecord:{out}", "train", image_size=8, batch_size=2, training=False)


def test_tfrecord_shards_by_file_between_workers(folder, tmp_path):
    out = str(tmp_path / "records")
    load_cli().convert(folder.root, out, splits=["train"], images_per_shard=3)  # 4 files
    seen = []
    for worker in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker)
        images, _ = collect(make_dataset(f"tfrecord:{out}", "train", image_size=8, batch_size=3,
                                         training=True, seed=1, input_context=context))
        seen.append(set(folder.identify("train", images)))
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(range(12))


def test_tfrecord_object_boxes_reach_the_training_crop(tmp_path, encode_image):
    # TF-slim style ImageNet records carry image/object/bbox/*; a record may have none.
    path = str(tmp_path / "train-00000-of-00001")
    boxes = [[[0.1, 0.5, 0.6, 0.9], [0.0, 0.0, 0.25, 0.25]], []]
    with tf.io.TFRecordWriter(path) as writer:
        for label, image_boxes in enumerate(boxes):
            feature = {
                sources.TFRECORD_IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[encode_image(np.full((32, 48, 3), 90 * label, np.uint8), "png")])),
                sources.TFRECORD_LABEL_KEY: tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[label])),
            }
            for k, key in enumerate(sources.TFRECORD_BOX_KEYS):
                feature[key] = tf.train.Feature(float_list=tf.train.FloatList(
                    value=[box[k] for box in image_boxes]))
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())
    records = sources.read_records(f"tfrecord:{path}", "train")
    read = [tf.io.parse_tensor(r["boxes"], tf.float32).numpy() for r in records.dataset]
    np.testing.assert_allclose(read[0], boxes[0])
    assert read[1].shape == (0, 4)
    images, labels = collect(make_dataset(f"tfrecord:{path}", "train", image_size=8,
                                          batch_size=2, training=True, seed=0,
                                          num_classes=2))
    assert images.shape == (2, 8, 8, 3) and sorted(labels) == [0, 1]
