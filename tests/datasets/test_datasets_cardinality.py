"""Known batch counts for the library's own datasets (digits, Fashion-MNIST), so that
`model.fit` shows steps; a damaged image there is an error that says how to repair it; user
folders keep skipping and counting, with the count unknown."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.datasets import (
    DamagedDataError,
    SkipCounter,
    make_dataset,
    prepare_digits,
)
from keras_efficientnet.datasets.sources import fashion_mnist
from keras_efficientnet.training.builders import reporting_data_errors


def _digits_validation_count() -> int:
    # Independent of the folder: scikit-learn's labels, and the split rule (every 5th image of
    # each class is held out) applied by hand.
    from sklearn.datasets import load_digits

    return int(sum(n // 5 for n in np.bincount(load_digits().target)))


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    prepare_digits(data_dir)
    return data_dir


def test_digits_validation_has_355_images_by_hand():
    assert _digits_validation_count() == 355


@pytest.mark.parametrize("batch_size", [64, 71])  # 355 = 5 * 71: no partial batch
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_digits_validation_states_its_batch_count(digits_dir, batch_size, drop_remainder):
    count = _digits_validation_count()
    dataset = make_dataset("digits", "validation", image_size=32, batch_size=batch_size,
                           training=False, drop_remainder=drop_remainder, data_dir=digits_dir)
    expected = count // batch_size if drop_remainder else math.ceil(count / batch_size)
    assert int(dataset.cardinality()) == expected
    assert sum(1 for _ in dataset) == expected  # and it holds


def test_digits_training_pass_drops_the_remainder_and_repeating_stays_infinite(digits_dir):
    train = make_dataset("digits", "train", image_size=32, batch_size=64, training=True,
                         data_dir=digits_dir, seed=0, mixup_alpha=0.2)
    assert int(train.cardinality()) == (1797 - 355) // 64  # 1442 // 64 = 22
    forever = make_dataset("digits", "train", image_size=32, batch_size=64, training=True,
                           repeat=True, data_dir=digits_dir)
    assert int(forever.cardinality()) == int(tf.data.INFINITE_CARDINALITY)


@pytest.mark.parametrize("pipeline_id, expected", [(0, 178), (1, 177)])
def test_a_shard_states_its_own_batch_count(digits_dir, pipeline_id, expected):
    # Two input pipelines: records 0, 2, 4, ... (178 of 355) and 1, 3, ... (177).
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id,
                                         num_replicas_in_sync=2)
    dataset = make_dataset("digits", "validation", image_size=32, batch_size=40,
                           training=False, data_dir=digits_dir, input_context=context)
    # Per replica: 40 / 2 = 20 images a batch.
    assert int(dataset.cardinality()) == math.ceil(expected / 20)
    assert sum(int(labels.shape[0]) for _, labels in dataset) == expected


@pytest.mark.skipif(not os.path.isdir(fashion_mnist.DEFAULT_DIR),
                    reason=f"Fashion-MNIST not installed at {fashion_mnist.DEFAULT_DIR} "
                           f"({fashion_mnist.INSTALL})")
@pytest.mark.parametrize("drop_remainder, expected", [(False, 79), (True, 78)])
def test_fashion_mnist_validation_states_its_batch_count(drop_remainder, expected):
    # The last 5,000 of the 60,000 training images: 5000 / 64 = 78.1.
    dataset = make_dataset("fashion_mnist", "validation", image_size=28, batch_size=64,
                           training=False, drop_remainder=drop_remainder)
    assert int(dataset.cardinality()) == expected


def test_a_user_folder_keeps_an_unknown_count(folder):
    # A corrupt photo there is skipped and counted, so the count is known only after a pass.
    dataset = make_dataset(f"folder:{folder.root}", "validation", image_size=16, batch_size=4,
                           training=False)
    assert int(dataset.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)


def test_fit_on_the_quick_start_digits_shows_steps_from_epoch_one(digits_dir, capsys, recwarn):
    import keras

    # The README quick start's datasets; a tiny model in place of its EfficientNet.
    train = make_dataset("digits", "train", image_size=32, batch_size=64, training=True,
                         random_flip=False, data_dir=digits_dir)
    val = make_dataset("digits", "validation", image_size=32, batch_size=64, training=False,
                       data_dir=digits_dir)
    model = keras.Sequential([
        keras.Input((32, 32, 3), dtype="uint8"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile("sgd", "sparse_categorical_crossentropy")
    model.fit(train, validation_data=val, epochs=1, verbose=2)
    output = capsys.readouterr()
    text = output.out + output.err + "".join(str(w.message) for w in recwarn)
    assert "Unknown" not in text and "ran out of data" not in text, text
    assert "22/22" in text, text  # 1442 training images // 64


@pytest.fixture
def damaged_digits(digits_dir, tmp_path):
    """A copy of the digits folder with one validation PNG cut short; returns (data_dir, file)."""
    shutil.copytree(digits_dir / "digits", tmp_path / "digits")
    damaged = sorted((tmp_path / "digits" / "validation" / "3").iterdir())[0]
    damaged.write_bytes(damaged.read_bytes()[:30])
    return tmp_path, damaged


@pytest.mark.parametrize("cache", [False, True])
def test_a_damaged_digits_image_is_an_error_naming_it_and_the_repair(damaged_digits, cache):
    data_dir, damaged = damaged_digits
    counter = SkipCounter()
    dataset = make_dataset("digits", "validation", image_size=32, batch_size=64,
                           training=False, data_dir=data_dir, skip_counter=counter, cache=cache)
    with pytest.raises(DamagedDataError) as raised, reporting_data_errors(counter):
        for _ in dataset:
            pass
    message = str(raised.value)
    assert message == (
        f"unreadable image {damaged} in digits (split 'validation'), data the library wrote "
        f"or checked itself, so it is damaged: delete the folder "
        f"{str(data_dir / 'digits')!r} and it will be rewritten")
    assert counter.count == 0  # raised, not skipped


def test_deleting_the_damaged_digits_folder_repairs_it(damaged_digits):
    data_dir, _ = damaged_digits
    shutil.rmtree(data_dir / "digits")
    dataset = make_dataset("digits", "validation", image_size=32, batch_size=64,
                           training=False, data_dir=data_dir)
    assert sum(int(labels.shape[0]) for _, labels in dataset) == _digits_validation_count()
