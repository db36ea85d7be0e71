"""Sources: digits, image folders, TFRecords, tfds and synthetic, and their error messages."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.datasets import (
    dataset_info,
    make_dataset,
    parse_source,
    prepare_digits,
    sources,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def collect(dataset):
    pairs = [(x.numpy(), y.numpy()) for x, y in dataset]
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("source, expected", [
    ("synthetic", ("synthetic", "")),
    ("digits", ("digits", "")),
    ("folder:/a/b:c", ("folder", "/a/b:c")),
    ("tfds:imagenet2012", ("tfds", "imagenet2012")),
    ("tfrecord:/x/{split}-*", ("tfrecord", "/x/{split}-*")),
])
def test_parse_source(source, expected):
    assert parse_source(source) == expected


@pytest.mark.parametrize("source, message", [
    ("imagenet", "unknown dataset source 'imagenet'; valid: 'synthetic', 'digits'"),
    ("folder:", "needs an argument"),
    ("digits:extra", "takes no argument"),
    ("", "non-empty string"),
])
def test_parse_source_errors_name_the_valid_sources(source, message):
    with pytest.raises(ValueError, match=message):
        parse_source(source)


# ---------------------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    prepare_digits(data_dir)
    return data_dir


def test_digits_are_the_real_scikit_learn_digits_in_ten_classes(digits_dir):
    from sklearn.datasets import load_digits

    train = dataset_info("digits", "train", data_dir=digits_dir)
    validation = dataset_info("digits", "validation", data_dir=digits_dir)
    assert train.num_classes == validation.num_classes == 10
    assert train.class_names == tuple(str(d) for d in range(10))
    assert train.num_examples + validation.num_examples == 1797
    assert abs(validation.num_examples / 1797 - 0.2) < 0.01
    # Through the pipeline at 32x32 with no resize, each image must be its scikit-learn digit.
    dataset = make_dataset("digits", "validation", image_size=32, batch_size=64, training=False,
                           data_dir=digits_dir, eval_resize_ratio=1.0)
    images, labels = collect(dataset)
    assert images.shape == (validation.num_examples, 32, 32, 3)
    assert set(labels) == set(range(10))
    digits = load_digits()
    reference = np.round(digits.images * 255 / 16).astype(np.uint8)
    reference = np.repeat(np.repeat(reference, 4, axis=1), 4, axis=2)
    lookup = {ref.tobytes(): label for ref, label in zip(reference, digits.target)}
    for image, label in zip(images, labels):
        assert np.array_equal(image[..., 0], image[..., 2])  # grey, stored as RGB
        assert lookup[image[..., 0].tobytes()] == label
    assert images.std() > 50  # ink on background, not blank


def test_digits_are_written_once_and_atomically(digits_dir):
    root = os.path.join(digits_dir, "digits")
    marker = os.path.join(root, ".complete")
    stamp = os.path.getmtime(marker)
    assert str(prepare_digits(digits_dir)) == root
    assert os.path.getmtime(marker) == stamp
    assert not [n for n in os.listdir(digits_dir) if n.startswith(".digits-")]  # no leftovers


def test_digits_refuse_to_reuse_a_half_written_folder(tmp_path):
    os.makedirs(tmp_path / "digits" / "train")
    with pytest.raises(FileExistsError, match="not a complete digits folder"):
        prepare_digits(tmp_path)


def test_default_data_dir_is_the_repo_data_folder_or_the_env_override(monkeypatch, tmp_path):
    monkeypatch.delenv(sources.DATA_DIR_ENV, raising=False)
    assert os.path.realpath(sources.default_data_dir()) == os.path.realpath(
        os.path.join(REPO, "data"))
    monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path))
    assert sources.default_data_dir() == tmp_path


# ---------------------------------------------------------------------------- folder errors


def test_missing_folder_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*<split>/<class>"):
        make_dataset(f"folder:{tmp_path}/nowhere", "train", image_size=8, batch_size=2,
                     training=False)


def test_missing_split_lists_the_available_ones(folder):
    with pytest.raises(ValueError, match=r"split 'test' not found.*\['train', 'validation'\]"):
        dataset_info(f"folder:{folder.root}", "test")


def test_empty_split_is_an_error(folder):
    for name in ("cat", "dog", "owl"):
        shutil.rmtree(os.path.join(folder.root, "validation", name))
        os.makedirs(os.path.join(folder.root, "validation", name))
    with open(os.path.join(folder.root, "validation", "cat", "readme.txt"), "w") as f:
        f.write("not an image")
    with pytest.raises(ValueError, match="'validation' .* has no images"):
        make_dataset(f"folder:{folder.root}", "validation", image_size=8, batch_size=2,
                     training=False)


def test_class_folders_that_differ_between_splits_are_named(folder):
    os.rename(os.path.join(folder.root, "validation", "owl"),
              os.path.join(folder.root, "validation", "eagle"))
    with pytest.raises(ValueError, match=r"only in 'train': \['owl'\]; only in 'validation': "
                                         r"\['eagle'\]"):
        dataset_info(f"folder:{folder.root}", "train")


def test_split_without_class_folders_is_an_error(tmp_path):
    os.makedirs(tmp_path / "train")
    with pytest.raises(ValueError, match="no class folders"):
        dataset_info(f"folder:{tmp_path}", "train")


# ---------------------------------------------------------------------------- TFRecord


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
    load_cli().main(["--input_dir", folder.root, "--output_dir", out, "--images_per_shard", "5"])
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


# ---------------------------------------------------------------------------- tfds


@pytest.fixture(scope="module")
def tiny_tfds(tmp_path_factory):
    tfds = pytest.importorskip("tensorflow_datasets")

    class KeTestTinyImages(tfds.core.GeneratorBasedBuilder):
        """Eight flat 16x16 images in two classes, generated locally."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(16, 16, 3)),
                "label": tfds.features.ClassLabel(names=["even", "odd"]),
            }))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(0, 6),
                    "validation": self._generate_examples(6, 8)}

        def _generate_examples(self, start, stop):
            for i in range(start, stop):
                yield i, {"image": np.full((16, 16, 3), 20 + 25 * i, np.uint8), "label": i % 2}

    data_dir = tmp_path_factory.mktemp("tfds")
    KeTestTinyImages(data_dir=str(data_dir)).download_and_prepare()
    return "ke_test_tiny_images", str(data_dir)


def test_tfds_source_reads_encoded_images_with_labels(tiny_tfds):
    name, data_dir = tiny_tfds
    info = dataset_info(f"tfds:{name}", "train", data_dir=data_dir)
    assert (info.num_examples, info.num_classes, info.class_names) == (6, 2, ("even", "odd"))
    images, labels = collect(make_dataset(f"tfds:{name}", "train", image_size=8, batch_size=3,
                                          training=True, seed=0, data_dir=data_dir))
    levels = images[..., 0].reshape(len(images), -1).mean(axis=1)
    index = np.round((levels - 20) / 25).astype(int)
    assert sorted(index) == list(range(6))
    np.testing.assert_array_equal(labels, index % 2)


def test_tfds_errors_name_what_is_valid(tiny_tfds, tmp_path):
    name, data_dir = tiny_tfds
    with pytest.raises(ValueError, match=r"split 'test' not in .* available: \['train', "):
        dataset_info(f"tfds:{name}", "test", data_dir=data_dir)
    with pytest.raises(ValueError, match="unknown tensorflow-datasets name 'imagenet2013'.*"
                                         "imagenet2012"):
        dataset_info("tfds:imagenet2013", "train")
    with pytest.raises(FileNotFoundError, match="not prepared.*tfds build"):
        dataset_info(f"tfds:{name}", "train", data_dir=str(tmp_path))


# ---------------------------------------------------------------------------- synthetic


def test_synthetic_info_and_determinism():
    info = dataset_info("synthetic", "train", num_classes=10)
    assert (info.num_examples, info.num_classes) == (sources.SYNTHETIC_EXAMPLES["train"], 10)
    first = [make_dataset("synthetic", "validation", image_size=8, batch_size=4, training=False,
                          seed=3).take(1).get_single_element() for _ in range(2)]
    np.testing.assert_array_equal(first[0][0].numpy(), first[1][0].numpy())
    np.testing.assert_array_equal(first[0][1].numpy(), first[1][1].numpy())
    with pytest.raises(ValueError, match=r"available: \['train', 'validation'\]"):
        dataset_info("synthetic", "test")


def test_tfds_object_boxes_are_found_where_a_dataset_keeps_them():
    tfds = pytest.importorskip("tensorflow_datasets")
    from types import SimpleNamespace

    def builder(features):
        return SimpleNamespace(info=SimpleNamespace(features=tfds.features.FeaturesDict(features)))

    image, label = tfds.features.Image(), tfds.features.ClassLabel(num_classes=2)
    objects = tfds.features.Sequence({"bbox": tfds.features.BBoxFeature(), "label": label})
    assert sources._tfds_box_path(builder({"image": image, "objects": objects})) == (
        "objects", "bbox")
    assert sources._tfds_box_path(builder({"image": image, "box": tfds.features.BBoxFeature()})
                                  ) == ("box",)
    # imagenet2012's features (image, label, file_name): no boxes.
    assert sources._tfds_box_path(builder({"image": image, "label": label,
                                           "file_name": tfds.features.Text()})) is None
