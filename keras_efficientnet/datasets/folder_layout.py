"""How an image folder is laid out: its split folders (the held-out one as `validation/`, `val/`
or `valid/`), or a plain folder of class folders, and the stratified hold-out of
`--validation_split`. Plain Python: the commands check a folder with it before TensorFlow loads.

Two layouts:

- splits: `ROOT/<split>/<class>/**/*.jpg`, recognised by a folder named `train`, `validation`,
  `val`, `valid` or `test` (or the split asked for) that holds no image directly;
- classes: `ROOT/<class>/**/*.jpg`, anything else. Its one pool of images is the training
  split; a held-out split exists only through `HoldOut`.

A `HoldOut` (`datasets.options`) takes a fraction of each class of the pool split (stratified),
the same images in every run and process: each image's rank is a keyed hash of its path inside
the pool folder, so the choice depends on the seed and the file names alone (not on the listing
order, the machine, NumPy's generators, or the training `--seed`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from keras_efficientnet.datasets.options import IMAGE_EXTENSIONS, HoldOut

# The held-out split's folder under any of these names ("validation" first: the default
# --eval_split); asking for one of them finds whichever the folder has.
HELD_OUT_NAMES = ("validation", "val", "valid")
# Folder names that mark the splits layout (with the split a command asks for).
SPLIT_NAMES = ("train", *HELD_OUT_NAMES, "test")
@dataclasses.dataclass(frozen=True)
class SplitFolder:
    """Where a split's images are: `folder/<class>/**`, all of them (`part="all"`), the pool
    without its hold-out (`"kept"`) or the hold-out alone (`"held_out"`); `siblings`: the other
    split folders, which must have the same class folders."""

    folder: Path
    part: str = "all"
    siblings: tuple[Path, ...] = ()


def _has_images(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return any(e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS) for e in entries)


def _subfolders(folder: Path) -> list[str]:
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if e.is_dir())


def split_folders(root: str | os.PathLike, asked: tuple[str, ...] = ()) -> list[str] | None:
    """The split folders of `root` when it has the splits layout, else None (a folder of class
    folders). `asked`: split names a command reads, which mark the layout too."""
    names = _subfolders(Path(root))
    marks = set(SPLIT_NAMES) | set(asked)
    if any(name in marks and not _has_images(Path(root) / name) for name in names):
        return names
    return None


def locate_split(root: str | os.PathLike, split: str, hold_out: HoldOut | None = None
                 ) -> SplitFolder:
    """Where `split` of the image folder `root` is; ValueError in one line naming what is
    valid (the folder names and `--validation_split` where no held-out split exists)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist; expected the layout "
                                f"{root}/<split>/<class>/*.jpg (or .png)")
    asked = (split, hold_out.pool) if hold_out else (split,)
    splits = split_folders(root, asked)
    if splits is None:
        return _in_class_folders(root, split, hold_out)
    held_out = [name for name in HELD_OUT_NAMES if name in splits]
    if hold_out is not None and held_out and split in (hold_out.pool, *HELD_OUT_NAMES):
        raise ValueError(f"--validation_split={hold_out.fraction:g} holds out part of "
                         f"{hold_out.pool}/, but image folder {str(root)!r} has its own "
                         f"held-out folder {held_out[0]}/: drop --validation_split, or move "
                         f"that folder away")
    siblings = tuple(root / name for name in splits)
    if split in splits:
        part = "kept" if hold_out is not None and split == hold_out.pool else "all"
        return SplitFolder(root / split, part, siblings)
    if split in HELD_OUT_NAMES and held_out:
        if len(held_out) > 1:
            raise ValueError(f"image folder {str(root)!r} has {len(held_out)} held-out folders "
                             f"({', '.join(n + '/' for n in held_out)}); keep one")
        return SplitFolder(root / held_out[0], "all", siblings)
    if split in HELD_OUT_NAMES and hold_out is not None and hold_out.pool in splits:
        return SplitFolder(root / hold_out.pool, "held_out", siblings)
    if split in HELD_OUT_NAMES and hold_out is not None:  # its pool folder is missing
        raise ValueError(f"--validation_split={hold_out.fraction:g} holds out part of the split "
                         f"{hold_out.pool!r}, which image folder {str(root)!r} does not have "
                         f"(its splits: {splits}); give --train_split one of them")
    if split in HELD_OUT_NAMES:
        raise ValueError(f"image folder {str(root)!r} has no held-out split (its splits: "
                         f"{splits}): name its folder validation/, val/ or valid/ "
                         f"({root}/val/<class>/*.jpg), or pass --validation_split=0.1 to hold "
                         f"out a tenth of each class of train/")
    raise ValueError(f"split {split!r} not found in image folder {str(root)!r}; available "
                     f"splits: {splits}")


def _in_class_folders(root: Path, split: str, hold_out: HoldOut | None) -> SplitFolder:
    """A plain folder of class folders: the pool is the training split, the hold-out its
    held-out split."""
    classes = _subfolders(root)
    shown = ", ".join(classes[:4]) + (", ..." if len(classes) > 4 else "")
    pool = hold_out.pool if hold_out else "train"
    if split == pool:
        return SplitFolder(root, "kept" if hold_out else "all")
    if split in HELD_OUT_NAMES and hold_out is not None:
        return SplitFolder(root, "held_out")
    if split in HELD_OUT_NAMES:
        raise ValueError(f"image folder {str(root)!r} is a folder of class folders ({shown}) "
                         f"with no held-out split: pass --validation_split=0.1 to hold out a "
                         f"tenth of each class, or arrange it as {root}/train/<class>/ and "
                         f"{root}/val/<class>/")
    raise ValueError(f"image folder {str(root)!r} is a folder of class folders ({shown}): its "
                     f"images are the {pool!r} split (and, with --validation_split, a held-out "
                     f"'validation'); there is no split {split!r}")


def check_splits(root: str | os.PathLike, splits: tuple[str, ...],
                 hold_out: HoldOut | None = None) -> None:
    """Before TensorFlow loads: each of `splits` can be found in `root` (ValueError as
    `locate_split`), without listing the images."""
    for split in dict.fromkeys(splits):
        locate_split(root, split, hold_out)
