"""An image folder's layout (`datasets.folder_layout`, plain Python): the held-out split under
any of its names, a plain folder of class folders, the stratified hold-out of
--validation_split and the errors that name both fixes."""

from __future__ import annotations

import pytest

from keras_efficientnet.datasets.folder_layout import check_splits, locate_split, split_folders
from keras_efficientnet.datasets.options import HoldOut


def _touch(root, *relative_paths):
    for relative in relative_paths:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")  # the layout looks at names only


def _images(folder, classes: dict[str, int]):
    _touch(folder, *(f"{name}/{i:03d}.png" for name, count in classes.items()
                     for i in range(count)))


@pytest.mark.parametrize("name", ["validation", "val", "valid"])
def test_the_held_out_folder_is_found_under_each_of_its_names(tmp_path, name):
    _images(tmp_path / "train", {"cat": 2, "dog": 2})
    _images(tmp_path / name, {"cat": 1, "dog": 1})
    for asked in ("validation", "val", "valid"):
        located = locate_split(tmp_path, asked)
        assert (located.folder, located.part) == (tmp_path / name, "all")
    assert set(located.siblings) == {tmp_path / "train", tmp_path / name}
    assert locate_split(tmp_path, "train").folder == tmp_path / "train"


def test_two_held_out_folders_are_refused(tmp_path):
    for split in ("train", "val", "validation"):
        _images(tmp_path / split, {"cat": 1})
    with pytest.raises(ValueError, match=r"2 held-out folders \(validation/, val/\); keep one"):
        locate_split(tmp_path, "valid")


def test_a_missing_held_out_split_names_both_fixes(tmp_path):
    _images(tmp_path / "train", {"cat": 2})
    with pytest.raises(ValueError) as caught:
        check_splits(tmp_path, ("train", "validation"))
    message = str(caught.value)
    assert "\n" not in message
    assert "has no held-out split (its splits: ['train'])" in message
    assert "name its folder validation/, val/ or valid/" in message
    assert "--validation_split=0.1 to hold out a tenth of each class of train/" in message


def test_another_missing_split_lists_the_ones_there(tmp_path):
    _images(tmp_path / "train", {"cat": 2})
    _images(tmp_path / "val", {"cat": 1})
    with pytest.raises(ValueError, match=r"split 'test' not found .*\['train', 'val'\]"):
        locate_split(tmp_path, "test")


def test_a_plain_folder_of_class_folders_is_read_as_classes(tmp_path):
    _images(tmp_path, {"cat": 3, "dog": 3, "test": 2})  # a class may be called "test"
    assert split_folders(tmp_path) is None
    located = locate_split(tmp_path, "train")
    assert (located.folder, located.part, located.siblings) == (tmp_path, "all", ())
    with pytest.raises(ValueError) as caught:
        locate_split(tmp_path, "validation")
    message = str(caught.value)
    assert "is a folder of class folders (cat, dog, test) with no held-out split" in message
    assert "--validation_split=0.1" in message and f"{tmp_path}/val/<class>/" in message
    held = HoldOut(0.25)
    assert locate_split(tmp_path, "train", held).part == "kept"
    assert locate_split(tmp_path, "val", held).part == "held_out"


def test_the_splits_layout_is_recognised_by_a_split_folder_without_images(tmp_path):
    _images(tmp_path / "train", {"cat": 1})
    _touch(tmp_path, "notes/readme.png")  # a stray folder beside the splits
    assert split_folders(tmp_path) == ["notes", "train"]
    _images(tmp_path / "mine", {"cat": 1})
    assert split_folders(tmp_path / "mine", asked=("cat",)) is None  # "cat" holds images
    _images(tmp_path / "custom" / "fit", {"cat": 1})
    assert split_folders(tmp_path / "custom") is None
    assert split_folders(tmp_path / "custom", asked=("fit",)) == ["fit"]


def test_a_hold_out_beside_a_held_out_folder_is_refused(tmp_path):
    _images(tmp_path / "train", {"cat": 2})
    _images(tmp_path / "val", {"cat": 1})
    for split in ("train", "validation"):
        with pytest.raises(ValueError, match=r"--validation_split=0.2 holds out part of train/, "
                                             r"but .* has its own held-out folder val/"):
            locate_split(tmp_path, split, HoldOut(0.2))


def test_the_hold_out_comes_out_of_the_training_split_folder(tmp_path):
    _images(tmp_path / "train", {"cat": 2})
    _images(tmp_path / "test", {"cat": 2})
    held = HoldOut(0.5)
    assert (locate_split(tmp_path, "validation", held).folder,
            locate_split(tmp_path, "validation", held).part) == (tmp_path / "train", "held_out")
    assert locate_split(tmp_path, "train", held).part == "kept"
    assert locate_split(tmp_path, "test", held).part == "all"
    with pytest.raises(ValueError, match=r"--validation_split=0.5 holds out part of the split "
                                         r"'fit', which image folder .* does not have \(its "
                                         r"splits: \['test', 'train'\]\); give --train_split"):
        locate_split(tmp_path, "validation", HoldOut(0.5, pool="fit"))
    mine = HoldOut(0.5, pool="fit")
    _images(tmp_path / "fit", {"cat": 2})
    assert locate_split(tmp_path, "val", mine).folder == tmp_path / "fit"


# Counts worked by hand: fraction x images rounded half up, at most images - 1.
# 0.2: 10 -> 2.0 -> 2; 7 -> 1.4 -> 1; 3 -> 0.6 -> 1; 1 -> 0.2 -> 0 (and at most 0).
# 0.25: 6 -> 1.5 -> 2 (half up, where round() would give 2 and 2.5 would give 2); 2 -> 0.5 -> 1.
# 0.5: 5 -> 2.5 -> 3 (round() would give 2); 1 -> 0.
# 0.9: 4 -> 3.6 -> 4, capped at 3 so the class keeps a training image.
HAND_COUNTS = [(0.2, 10, 2), (0.2, 7, 1), (0.2, 3, 1), (0.2, 1, 0), (0.25, 6, 2),
               (0.25, 2, 1), (0.5, 5, 3), (0.5, 1, 0), (0.9, 4, 3), (0.1, 0, 0)]


@pytest.mark.parametrize("fraction, images, held", HAND_COUNTS)
def test_each_class_holds_out_its_share_rounded_half_up(fraction, images, held):
    assert HoldOut(fraction).count(images) == held
    paths = [f"c/{i:03d}.png" for i in range(images)]
    assert len(HoldOut(fraction).held_out(paths)) == held


def test_the_held_out_images_depend_on_the_names_and_seed_alone():
    paths = [f"cat/img_{i:04d}.jpg" for i in range(200)]
    held = HoldOut(0.1).held_out(paths)
    assert len(held) == 20 and held <= set(paths)
    assert HoldOut(0.1).held_out(paths[::-1]) == held  # listing order does not matter
    assert HoldOut(0.1, pool="fit").held_out(paths) == held  # nor the pool's name
    # Another seed draws another tenth: two independent tenths share ~2 of 20 images.
    assert len(HoldOut(0.1, seed=1).held_out(paths) & held) < 10
    # One image more keeps almost every earlier choice (a rank per name, not a permutation).
    grown = HoldOut(0.1).held_out(paths + ["cat/img_9999.jpg"])
    assert len(grown & held) >= 19


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, float("nan")])
def test_a_fraction_outside_the_open_unit_interval_is_refused(fraction):
    with pytest.raises(ValueError, match="--validation_split must be in \\(0, 1\\)"):
        HoldOut(fraction)


def test_a_missing_folder_says_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"does not exist; expected the layout "):
        locate_split(tmp_path / "nowhere", "train")
