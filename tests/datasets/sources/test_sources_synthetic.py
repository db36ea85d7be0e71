"""`synthetic`: sizes, label range and determinism."""

from __future__ import annotations

import numpy as np
import pytest

from keras_efficientnet.datasets import dataset_info, make_dataset, sources


def test_synthetic_info_and_determinism():
    info = dataset_info("synthetic", "train", num_classes=10)
    assert (info.num_examples, info.num_classes) == (sources.SYNTHETIC_EXAMPLES["train"], 10)
    first = [make_dataset("synthetic", "validation", image_size=8, batch_size=4, training=False,
                          seed=3).take(1).get_single_element() for _ in range(2)]
    np.testing.assert_array_equal(first[0][0].numpy(), first[1][0].numpy())
    np.testing.assert_array_equal(first[0][1].numpy(), first[1][1].numpy())
    with pytest.raises(ValueError, match=r"available: \['train', 'validation'\]"):
        dataset_info("synthetic", "test")
