"""`tfds:NAME`: a tiny locally generated tfds dataset, its errors, and object boxes."""

from __future__ import annotations

import numpy as np
import pytest

from keras_efficientnet.datasets import dataset_info, make_dataset
from keras_efficientnet.datasets.sources.tfds import box_path


def collect(dataset):
    pairs = [(x.numpy(), y.numpy()) for x, y in dataset]
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


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


def test_tfds_object_boxes_are_found_where_a_dataset_keeps_them():
    tfds = pytest.importorskip("tensorflow_datasets")
    from types import SimpleNamespace

    def builder(features):
        return SimpleNamespace(info=SimpleNamespace(features=tfds.features.FeaturesDict(features)))

    image, label = tfds.features.Image(), tfds.features.ClassLabel(num_classes=2)
    objects = tfds.features.Sequence({"bbox": tfds.features.BBoxFeature(), "label": label})
    assert box_path(builder({"image": image, "objects": objects})) == (
        "objects", "bbox")
    assert box_path(builder({"image": image, "box": tfds.features.BBoxFeature()})
                                  ) == ("box",)
    # imagenet2012's features (image, label, file_name): no boxes.
    assert box_path(builder({"image": image, "label": label,
                                           "file_name": tfds.features.Text()})) is None
