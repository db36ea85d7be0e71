"""`folder:PATH`: listing, its errors, and one walk of the tree per run."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

from keras_efficientnet.datasets import dataset_info, make_dataset


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


def test_a_run_walks_the_folder_tree_once(folder, monkeypatch):
    # A trainer asks for the split's size, then reads it: one walk, while nothing changed.
    from keras_efficientnet.datasets.sources import folder as folder_module

    settled = time.time() - 10
    for directory, _, _ in os.walk(folder.root):
        os.utime(directory, (settled, settled))
    walks = []
    real_walk = os.walk
    monkeypatch.setattr(folder_module.os, "walk",
                        lambda top, *a, **k: walks.append(top) or real_walk(top, *a, **k))
    source = f"folder:{folder.root}"
    info = dataset_info(source, "train")
    dataset = make_dataset(source, "train", image_size=8, batch_size=4, training=True, seed=0)
    assert len(walks) == 3  # one per class folder of train, once
    assert info.num_examples == sum(len(b[1]) for b in dataset) == 12
    # A new image is seen: the changed folder invalidates the listing.
    shutil.copy(folder.items["train"][0][0], os.path.join(folder.root, "train", "cat", "x.png"))
    assert dataset_info(source, "train").num_examples == 13
    assert len(walks) == 6


def test_a_folder_changed_just_before_listing_is_listed_again(folder, monkeypatch):
    # Within SETTLED_SECONDS of a change, a coarse clock could hide the next one: no reuse.
    from keras_efficientnet.datasets.sources import folder as folder_module

    walks = []
    real_walk = os.walk
    monkeypatch.setattr(folder_module.os, "walk",
                        lambda top, *a, **k: walks.append(top) or real_walk(top, *a, **k))
    dataset_info(f"folder:{folder.root}", "train")
    dataset_info(f"folder:{folder.root}", "train")
    assert len(walks) == 6


def test_predict_and_the_folder_source_take_the_same_image_files():
    from keras_efficientnet.cli import predict
    from keras_efficientnet.datasets import options
    from keras_efficientnet.datasets.sources import folder

    assert predict.IMAGE_EXTENSIONS is options.IMAGE_EXTENSIONS is folder.IMAGE_EXTENSIONS


def test_a_held_out_folder_named_val_is_the_validation_split(folder):
    os.rename(os.path.join(folder.root, "validation"), os.path.join(folder.root, "val"))
    for split in ("validation", "val", "valid"):
        info = dataset_info(f"folder:{folder.root}", split)
        assert (info.num_examples, info.class_names) == (6, ("cat", "dog", "owl"))


def test_a_plain_folder_of_class_folders_is_its_classes(folder):
    train = os.path.join(folder.root, "train")
    info = dataset_info(f"folder:{train}", "train")
    assert (info.num_examples, info.class_names) == (12, ("cat", "dog", "owl"))
    with pytest.raises(ValueError, match="folder of class folders .* --validation_split"):
        dataset_info(f"folder:{train}", "validation")


def test_the_hold_out_splits_each_class_and_reads_exactly_its_images(make_folder):
    from keras_efficientnet.datasets import InputOptions
    from keras_efficientnet.datasets.options import HoldOut

    # 7 images a class, 0.3 held out: 2.1 rounds to 2 a class (by hand), 6 of 21 in all.
    made = make_folder(counts={"train": 7})
    root = os.path.join(made.root, "train")  # a plain folder of class folders
    hold_out = HoldOut(0.3)
    kept = dataset_info(f"folder:{root}", "train", hold_out=hold_out)
    held = dataset_info(f"folder:{root}", "validation", hold_out=hold_out)
    assert (kept.num_examples, held.num_examples) == (15, 6)
    seen = {}
    for split in ("train", "validation"):
        options = InputOptions(f"folder:{root}", split, image_size=8, batch_size=32,
                               training=False, hold_out=hold_out)
        images, labels = next(iter(make_dataset(options)))
        index = made.identify("train", images.numpy())
        assert list(made.labels("train")[index]) == list(labels.numpy())
        seen[split] = set(index.tolist())
    assert not seen["train"] & seen["validation"]
    assert seen["train"] | seen["validation"] == set(range(21))
    per_class = np.bincount(made.labels("train")[sorted(seen["validation"])], minlength=3)
    assert per_class.tolist() == [2, 2, 2]
