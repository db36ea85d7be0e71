"""The source table: parsing source strings, one reader per kind, one row per kind."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.datasets import make_dataset, sources
from keras_efficientnet.datasets.source_table import SOURCE_TABLE, SourceKind, parse_source


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
    ("fodler:x", "unknown dataset source 'fodler:x'; did you mean 'folder'\\? valid: "),
    ("folder:", "needs an argument"),
    ("digits:extra", "takes no argument"),
    ("", "non-empty string"),
])
def test_parse_source_errors_name_the_valid_sources(source, message):
    with pytest.raises(ValueError, match=message):
        parse_source(source)


def test_every_kind_is_one_module_and_one_table_line():
    assert set(SOURCE_TABLE) == {"synthetic", "digits", "fashion_mnist", "folder", "tfds",
                                 "tfrecord"}
    for kind, row in SOURCE_TABLE.items():
        reader = row.reader_class()
        assert issubclass(reader, sources.Reader)
        assert reader.__module__ == f"keras_efficientnet.datasets.sources.{kind}"
        assert row.usage.strip("'").split(":")[0] == kind
        assert (row.example is None) == (":" not in row.usage)
    assert [k for k, row in SOURCE_TABLE.items() if row.local_folder] == ["folder"]


class Stripes(sources.Reader):
    """A source written for this test: 5 decoded 4x4 images, image k filled with 10 * k."""

    def info(self, split):
        return sources.DatasetInfo(self.source, split, 5, 4, None)

    def records(self, split, *, input_context=None, shuffle_files=False, seed=None,
                image_size=224):
        images = np.stack([np.full((image_size, image_size, 3), 10 * k, np.uint8)
                           for k in range(5)])
        labels = np.full([5], int(self.argument), np.int32)
        dataset = tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})
        return sources.Records(dataset, self.info(split), decoded=True)


def test_a_new_source_is_a_reader_and_one_table_line(monkeypatch):
    monkeypatch.setitem(SOURCE_TABLE, "stripes",
                        SourceKind(f"{__name__}:Stripes", "'stripes:LABEL'", "stripes:3"))
    images, labels = next(iter(make_dataset("stripes:3", "train", image_size=4, batch_size=5,
                                            training=False)))
    np.testing.assert_array_equal(images.numpy()[:, 0, 0, 0], [0, 10, 20, 30, 40])
    np.testing.assert_array_equal(labels.numpy(), [3] * 5)
    assert sources.dataset_info("stripes:1", "validation").num_examples == 5
    with pytest.raises(ValueError, match="needs an argument after the colon, e.g. 'stripes:3'"):
        parse_source("stripes")
