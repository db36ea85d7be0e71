"""Unreadable images: a split of only bad files stops (naming it) instead of looping forever,
each bad file is logged once; --eval_steps reads a sample of every class, not class 0 first."""

from __future__ import annotations

import logging
import threading
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from keras_efficientnet.datasets import NoReadableImagesError, SkipCounter, make_dataset
from tests.reliability.clitools import write_unreadable_folder

pytestmark = pytest.mark.tf_only

BOUND_S = 120  # generous: the failure comes after one pass over six files


def _bounded(fn):
    """Runs fn() in a thread; returns its result or exception, failing if it does not end."""
    outcome = {}

    def target():
        try:
            outcome["value"] = fn()
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"still running after {BOUND_S} s: a hang"
    return outcome


@pytest.mark.parametrize("training,repeat", [(True, True), (False, False)])
def test_a_split_of_only_unreadable_images_stops_naming_it(tmp_path, caplog, training, repeat):
    root = write_unreadable_folder(tmp_path / "photos")
    counter = SkipCounter()
    dataset = make_dataset(f"folder:{root}", "train", image_size=16, batch_size=2,
                           training=training, repeat=repeat, seed=0, skip_counter=counter)
    with caplog.at_level(logging.WARNING, logger="keras_efficientnet.datasets.pipeline"):
        outcome = _bounded(lambda: next(iter(dataset)))
    assert "value" not in outcome
    assert isinstance(counter.error, NoReadableImagesError)
    assert str(counter.error).startswith(f"no readable images in folder:{root} (split 'train') "
                                         f"(6 skipped, e.g. {root}/train/a/0.jpg)")
    assert str(counter.error) in str(outcome["error"])  # what TensorFlow raised carries it
    assert counter.count == 6
    assert len([r for r in caplog.records if "Skipped unreadable" in r.getMessage()]) == 6


def _colour_folder(root, classes: int, per_class: int, bad: int = 0):
    """root/<split>/<k>/ PNGs whose red level is the class (a decoded image names its class)."""
    for split in ("train", "validation"):
        for k in range(classes):
            folder = root / split / f"class{k}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                image = np.full((8, 8, 3), 20 * k, np.uint8)
                Image.fromarray(image).save(folder / f"{i}.png")
            for i in range(bad if k == 0 else 0):
                (folder / f"bad{i}.png").write_bytes(b"\x89PNG broken")
    return root


def test_each_bad_file_is_logged_once_however_many_passes(tmp_path, caplog):
    root = _colour_folder(tmp_path / "photos", classes=2, per_class=4, bad=3)
    counter = SkipCounter()
    dataset = make_dataset(f"folder:{root}", "train", image_size=8, batch_size=4, training=True,
                           repeat=True, seed=0, skip_counter=counter)
    with caplog.at_level(logging.WARNING, logger="keras_efficientnet.datasets.pipeline"):
        batches = [labels for _, (_, labels) in zip(range(8), dataset)]  # 4 passes
    assert sum(len(b) for b in batches) == 32
    logged = Counter(r.getMessage().split()[3] for r in caplog.records
                     if "Skipped unreadable" in r.getMessage())
    expected = {str(root / "train" / "class0" / f"bad{i}.png") for i in range(3)}
    assert set(logged) == expected and set(logged.values()) == {1}
    assert counter.count == 3 and counter.error is None


def test_evaluation_batches_sample_every_class_not_the_first_ones(tmp_path):
    classes, per_class = 8, 6
    root = _colour_folder(tmp_path / "photos", classes=classes, per_class=per_class)
    dataset = make_dataset(f"folder:{root}", "validation", image_size=8, batch_size=8,
                           training=False, eval_resize_ratio=1.0)
    batches = [(images.numpy(), labels.numpy()) for images, labels in dataset]
    labels = np.concatenate([b[1] for b in batches])
    # The whole split, each file once, and the label read from each image's colour.
    assert sorted(labels.tolist()) == sorted(list(range(classes)) * per_class)
    for images, batch_labels in batches:
        np.testing.assert_array_equal(images[:, 0, 0, 0] // 20, batch_labels)
    # Sorted listing order would give classes {0} then {0, 1}; the first two batches (what
    # --eval_steps=2 reads) now hold most classes, in the same order every time.
    assert len(set(labels[:16].tolist())) >= classes - 2
    again = np.concatenate([b[1].numpy() for b in make_dataset(
        f"folder:{root}", "validation", image_size=8, batch_size=8, training=False)])
    np.testing.assert_array_equal(again, labels)
