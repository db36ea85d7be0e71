"""make_dataset end to end on tiny image folders: content, sharding, seeds, bad files, errors."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.datasets import SkipCounter, make_dataset


def collect(dataset):
    images, labels = [], []
    for x, y in dataset:
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


def folder_source(folder):
    return f"folder:{folder.root}"


def test_eval_yields_every_image_once_with_its_label(folder):
    dataset = make_dataset(folder_source(folder), "validation", image_size=16, batch_size=4,
                           training=False)
    images, labels = collect(dataset)
    assert images.dtype == np.uint8 and images.shape[1:] == (16, 16, 3)
    assert labels.dtype == np.int32
    index = folder.identify("validation", images)
    assert sorted(index) == list(range(len(folder.items["validation"])))
    np.testing.assert_array_equal(labels, folder.labels("validation")[index])


def test_training_batches_uint8_images_and_one_hot_mixed_labels(folder):
    dataset = make_dataset(folder_source(folder), "train", image_size=16, batch_size=4,
                           training=True, mixup_alpha=0.2, cutmix_lambda=0.8, seed=0)
    assert dataset.element_spec[0].shape.as_list() == [4, 16, 16, 3]
    assert dataset.element_spec[0].dtype == tf.uint8
    assert dataset.element_spec[1].shape.as_list() == [4, 3]
    images, labels = collect(dataset)
    assert len(images) == 12  # 12 images, batches of 4, remainder dropped
    np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-6)


def test_training_without_mixing_gives_sparse_labels_matching_images(folder):
    dataset = make_dataset(folder_source(folder), "train", image_size=12, batch_size=3,
                           training=True, seed=1)
    images, labels = collect(dataset)
    index = folder.identify("train", images)
    # Crops and flips of a flat image are the same flat image: each file exactly once an epoch.
    assert sorted(index) == list(range(12))
    np.testing.assert_array_equal(labels, folder.labels("train")[index])


def test_fine_tune_input_is_shuffled_training_images_with_eval_crops(folder):
    # training=True, augment=False: the fine-tune phase's input (docs/recipes.md).
    kwargs = {"image_size": 12, "batch_size": 12, "mixup_alpha": 0.2}
    tuned = make_dataset(folder_source(folder), "train", training=True, augment=False, seed=3,
                         **kwargs)
    evaluated = make_dataset(folder_source(folder), "train", training=False, **kwargs)
    (tuned_images, tuned_labels), (eval_images, _) = collect(tuned), collect(evaluated)
    assert tuned_labels.shape == (12, 3) and set(tuned_labels.ravel()) <= {0.0, 1.0}  # no mixing
    tuned_order = folder.identify("train", tuned_images)
    assert sorted(tuned_order) == list(range(12)) and list(tuned_order) != list(range(12))
    eval_order = folder.identify("train", eval_images)
    np.testing.assert_array_equal(tuned_images[np.argsort(tuned_order)],
                                  eval_images[np.argsort(eval_order)])


def test_graphcores_fine_tune_input_mixes_eval_preprocessed_images(folder):
    # augment=False, mix=True: Graphcore's fine-tune keeps its run's Mixup and CutMix.
    kwargs = {"image_size": 12, "batch_size": 12, "mixup_alpha": 0.2, "cutmix_lambda": 0.8}
    mixed = make_dataset(folder_source(folder), "train", training=True, augment=False, mix=True,
                         seed=3, **kwargs)
    plain = make_dataset(folder_source(folder), "train", training=True, augment=False, seed=3,
                         **kwargs)
    (_, mixed_labels), (_, plain_labels) = collect(mixed), collect(plain)
    np.testing.assert_allclose(mixed_labels.sum(axis=1), 1.0, atol=1e-6)
    assert set(plain_labels.ravel()) <= {0.0, 1.0}
    assert not set(mixed_labels.ravel()) <= {0.0, 1.0}  # per-example Mixup weights


def test_random_flip_can_be_switched_off(make_folder, encode_image):
    folder = make_folder(counts={"train": 1})
    ramp = np.broadcast_to((4 * np.arange(64))[None, :, None], (48, 64, 3)).astype(np.uint8)
    for path, _, _ in folder.items["train"]:
        with open(path, "wb") as f:
            f.write(encode_image(ramp, "png" if path.endswith(".png") else "jpg"))

    def rising(random_flip):
        dataset = make_dataset(folder_source(folder), "train", image_size=16, batch_size=3,
                               training=True, seed=0, random_flip=random_flip, repeat=True)
        images = np.concatenate([x.numpy() for x, _ in dataset.take(8)]).astype(float)
        return images[:, :, -1].mean(axis=(1, 2)) > images[:, :, 0].mean(axis=(1, 2))

    assert rising(False).all()
    assert not rising(True).all()


def test_one_hot_in_eval_follows_the_mixing_flags(folder):
    dataset = make_dataset(folder_source(folder), "validation", image_size=8, batch_size=6,
                           training=False, mixup_alpha=0.2)
    _, labels = collect(dataset)
    index = np.argmax(labels, axis=1)
    assert labels.dtype == np.float32 and set(labels.ravel()) <= {0.0, 1.0}
    assert np.array_equal(np.sort(index), np.sort(folder.labels("validation")))


@pytest.mark.parametrize("training", [False, True])
def test_shards_are_disjoint_and_complete(folder, training):
    seen = []
    for worker in range(3):
        context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=worker,
                                             num_replicas_in_sync=3)
        dataset = make_dataset(folder_source(folder), "train", image_size=8, batch_size=3,
                               training=training, input_context=context, seed=4,
                               drop_remainder=False)
        assert dataset.element_spec[0].shape.as_list()[0] in (1, None)  # 3 replicas share 3
        images, _ = collect(dataset)
        seen.append(set(folder.identify("train", images)))
        assert len(images) == len(seen[-1])  # no image twice within a shard
    assert sum(len(s) for s in seen) == 12
    assert set().union(*seen) == set(range(12))


def test_same_seed_same_batches_other_seed_other_batches(folder):
    def first_batches(seed):
        dataset = make_dataset(folder_source(folder), "train", image_size=12, batch_size=4,
                               training=True, seed=seed, mixup_alpha=0.3, cutmix_lambda=0.7,
                               repeat=True)
        return [(x.numpy(), y.numpy()) for x, y in dataset.take(4)]

    a, b, c = first_batches(5), first_batches(5), first_batches(6)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert any(not np.array_equal(ya, yc) for (_, ya), (_, yc) in zip(a, c))


def test_epochs_reshuffle_and_recrop(make_folder):
    folder = make_folder(size=(48, 64))
    dataset = make_dataset(folder_source(folder), "train", image_size=8, batch_size=12,
                           training=True, seed=2)
    first, second = collect(dataset), collect(dataset)
    assert not np.array_equal(first[1], second[1])  # a new order each iteration


def write_bad_files(folder_root):
    split = os.path.join(folder_root, "validation")
    good = os.path.join(split, "cat", "000.jpg")
    with open(good, "rb") as f:
        jpeg = f.read()
    bad = {
        # Header bytes overwritten: libjpeg rejects it outright.
        os.path.join(split, "cat", "corrupt.jpg"): jpeg[:2] + b"\x13" * 200 + jpeg[202:],
        os.path.join(split, "dog", "truncated.jpg"): jpeg[: len(jpeg) // 3],
        os.path.join(split, "owl", "notes.jpg"): b"this is a text file, not a photo\n",
        os.path.join(split, "owl", "empty.png"): b"",
    }
    for path, data in bad.items():
        with open(path, "wb") as f:
            f.write(data)
    return sorted(bad)


@pytest.mark.parametrize("training", [False, True])
def test_bad_files_are_skipped_counted_and_named_without_shifting_labels(
        folder, training, caplog):
    bad = write_bad_files(folder.root)
    counter = SkipCounter()
    with caplog.at_level(logging.WARNING, logger="keras_efficientnet.datasets.pipeline"):
        dataset = make_dataset(folder_source(folder), "validation", image_size=8, batch_size=2,
                               training=training, seed=0, skip_counter=counter,
                               drop_remainder=False)
        images, labels = collect(dataset)
    index = folder.identify("validation", images)
    assert sorted(index) == list(range(6))  # every good image exactly once
    np.testing.assert_array_equal(labels, folder.labels("validation")[index])
    assert counter.count == len(bad)
    assert sorted(counter.names) == bad
    for path in bad:
        assert any(path in record.getMessage() for record in caplog.records)
    assert "(4 skipped so far)" in caplog.text


def test_cache_reads_files_once_and_gives_the_same_images(folder):
    kwargs = {"image_size": 8, "batch_size": 3, "training": False}
    plain = collect(make_dataset(folder_source(folder), "validation", **kwargs))
    cached = make_dataset(folder_source(folder), "validation", cache=True, **kwargs)
    first = collect(cached)
    for path, _, _ in folder.items["validation"]:
        os.remove(path)  # a second epoch must come from the cache
    second = collect(cached)
    order = [np.argsort(folder.identify("validation", run[0])) for run in (plain, first, second)]
    np.testing.assert_array_equal(plain[0][order[0]], first[0][order[1]])
    np.testing.assert_array_equal(first[0][order[1]], second[0][order[2]])


def test_thread_options_are_applied(folder):
    dataset = make_dataset(folder_source(folder), "validation", image_size=8, batch_size=2,
                           training=False, private_threadpool_size=2,
                           max_intra_op_parallelism=1, seed=3)
    options = dataset.options()
    assert options.threading.private_threadpool_size == 2
    assert options.threading.max_intra_op_parallelism == 1
    assert options.deterministic is True


def test_synthetic_source_for_smoke_runs():
    dataset = make_dataset("synthetic", "validation", image_size=16, batch_size=8,
                           training=True, num_classes=5, repeat=True)
    images, labels = next(iter(dataset))
    assert images.dtype == tf.uint8 and images.shape == (8, 16, 16, 3)
    assert labels.dtype == tf.int32 and np.all((labels >= 0) & (labels < 5))
    assert len(np.unique(images.numpy())) > 200  # random pixels, not a constant


def test_model_fit_consumes_it_directly(folder):
    import keras

    dataset = make_dataset(folder_source(folder), "train", image_size=8, batch_size=4,
                           training=True, mixup_alpha=0.2, seed=0)
    model = keras.Sequential([
        keras.Input((8, 8, 3), dtype="uint8"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile("sgd", "categorical_crossentropy")
    # Skipped files make the batch count unknown up front: Keras counts it in epoch 1 and says
    # the input "ran out of data" once; that is expected.
    with pytest.warns(UserWarning):
        history = model.fit(dataset, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"image_size": 0}, "image_size"),
    ({"batch_size": -1}, "batch_size"),
    ({"mixup_alpha": -0.1}, "mixup_alpha"),
    ({"cutmix_lambda": 1.5}, "cutmix_lambda"),
    ({"cutmix_version": 3}, r"cutmix_version must be one of \[1, 2\], got 3"),
    ({"eval_resize_ratio": 0.5}, "eval_resize_ratio"),
    ({"num_classes": 7}, "num_classes=7 but source"),
])
def test_bad_arguments_are_named(folder, kwargs, message):
    arguments = {"image_size": 8, "batch_size": 2, "training": True}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        make_dataset(folder_source(folder), "train", **arguments)
