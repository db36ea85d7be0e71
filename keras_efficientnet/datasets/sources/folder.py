"""`folder:PATH`: an image folder `PATH/<split>/<class>/**/*.jpg|png|...` or `PATH/<class>/...`
(`datasets.folder_layout`), labels by class."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_efficientnet.datasets.folder_layout import HoldOut, SplitFolder, locate_split
from keras_efficientnet.datasets.options import IMAGE_EXTENSIONS  # anything else: not listed
from keras_efficientnet.datasets.sources.base import DatasetInfo, Reader, Records

log = logging.getLogger(__name__)

# Seed of the fixed order in which unshuffled (evaluation) reads list an image folder.
EVAL_ORDER_SEED = 20210607
# A listing is reused (a run asks for a split's size first, then reads it) only while every
# folder it read keeps its modification time, and only if each was last changed this long
# before the listing began: a later change then shows as a newer time even where the file
# system's clock is coarse (the rule git uses for its index).
SETTLED_SECONDS = 2.0
MAX_LISTINGS = 4


@dataclasses.dataclass(frozen=True)
class Listing:
    """One split of an image folder: image paths, their labels, the class names, the images
    of each class (in the whole split folder, before any hold-out), the split folder itself,
    and the modification time (ns) of every folder read to list them."""

    paths: tuple[str, ...]
    labels: tuple[int, ...]
    classes: tuple[str, ...]
    counts: tuple[int, ...]
    folders: tuple[tuple[str, int], ...]
    settled: bool
    split_dir: str = ""

    def unchanged(self) -> bool:
        try:
            return self.settled and all(os.stat(folder).st_mtime_ns == mtime
                                        for folder, mtime in self.folders)
        except OSError:
            return False


_LISTINGS: dict[tuple, Listing] = {}
_LOCK = threading.Lock()
_WARNED: set[str] = set()  # empty class folders already warned about (once per process)


def _subfolders(directory: Path, folders: list) -> list[str]:
    folders.append((str(directory), os.stat(directory).st_mtime_ns))
    return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())


def _check_same_classes(located: SplitFolder, classes: list[str], folders: list) -> None:
    for other in located.siblings:
        other_classes = _subfolders(other, folders) if other != located.folder else classes
        if other_classes and other_classes != classes:
            only_here = sorted(set(classes) - set(other_classes))
            only_there = sorted(set(other_classes) - set(classes))
            raise ValueError(
                f"class folders differ between splits of {str(located.folder.parent)!r}: only "
                f"in {located.folder.name!r}: {only_here}; only in {other.name!r}: "
                f"{only_there}. Every split needs the same class folders so that labels mean "
                f"the same thing")


def _images_under(folder: Path, folders: list) -> list[str]:
    found = []
    for directory, subdirs, files in os.walk(folder):
        subdirs.sort()  # os.walk visits in this order: keeps the listing deterministic.
        folders.append((directory, os.stat(directory).st_mtime_ns))
        found += [os.path.join(directory, f) for f in sorted(files)
                  if f.lower().endswith(IMAGE_EXTENSIONS)]
    return found


def _list(root: Path, split: str, hold_out: HoldOut | None) -> Listing:
    started = time.time()
    located = locate_split(root, split, hold_out)
    folders: list[tuple[str, int]] = [(str(root), os.stat(root).st_mtime_ns)]
    split_dir = located.folder
    classes = _subfolders(split_dir, folders)
    if not classes:
        raise ValueError(f"split {split!r} of {str(root)!r} has no class folders; expected "
                         f"{split_dir}/<class>/*.jpg")
    _check_same_classes(located, classes, folders)
    paths, labels, counts = [], [], []
    for label, name in enumerate(classes):
        found = _images_under(split_dir / name, folders)
        counts.append(len(found))
        if located.part != "all":
            inside = [os.path.relpath(path, split_dir).replace(os.sep, "/") for path in found]
            held = hold_out.held_out(inside)
            found = [path for path, rel in zip(found, inside)
                     if (rel in held) == (located.part == "held_out")]
        paths += found
        labels += [label] * len(found)
    if not paths:
        raise ValueError(f"split {split!r} of {str(root)!r} has no images "
                         f"({', '.join('*' + e for e in IMAGE_EXTENSIONS)}) in its "
                         f"{len(classes)} class folders")
    settled = max(mtime for _, mtime in folders) < (started - SETTLED_SECONDS) * 1e9
    return Listing(tuple(paths), tuple(labels), tuple(classes), tuple(counts), tuple(folders),
                   settled, str(split_dir))


def folder_listing(root: str | os.PathLike, split: str, allow_empty_classes: bool = False,
                   hold_out: HoldOut | None = None) -> Listing:
    """The listing of `split` of `root` (`folder_layout.locate_split`: a split folder, the
    held-out folder under any of its names, a plain folder of class folders, or `hold_out`'s
    part of the pool split), walked once and reused while the folders are unchanged (see
    SETTLED_SECONDS). Labels index the sorted class folder names; every other split folder
    under `root` that has class folders must have the same ones. A class folder without
    images is refused, naming it, unless `allow_empty_classes` (then it stays a class that no
    image has, with a warning)."""
    key = (os.path.abspath(root), os.fspath(root), split, hold_out)
    with _LOCK:
        listing = _LISTINGS.get(key)
    if listing is None or not listing.unchanged():
        listing = _list(Path(root), split, hold_out)
        with _LOCK:
            _LISTINGS.pop(key, None)
            _LISTINGS[key] = listing
            while len(_LISTINGS) > MAX_LISTINGS:
                _LISTINGS.pop(next(iter(_LISTINGS)))
    _check_empty_classes(listing, Path(listing.split_dir), allow_empty_classes)
    return listing


def _check_empty_classes(listing: Listing, split_dir: Path, allowed: bool) -> None:
    empty = [str(split_dir / name) for name, count in zip(listing.classes, listing.counts)
             if count == 0]
    if not empty:
        return
    named = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
    kind = ", ".join("*" + e for e in IMAGE_EXTENSIONS)
    if not allowed:
        raise ValueError(f"class folder {named} has no images ({kind}); add images or remove "
                         f"the folder, or pass --allow_empty_classes to keep it as a class "
                         f"with no examples")
    with _LOCK:
        if named in _WARNED:
            return
        _WARNED.add(named)
    log.warning("Keeping empty class folder %s as a class with no examples "
                "(--allow_empty_classes)", named)


def list_image_folder(root: str | os.PathLike, split: str, allow_empty_classes: bool = False,
                      hold_out: HoldOut | None = None
                      ) -> tuple[list[str], list[int], list[str]]:
    """Lists `root/<split>/<class>/**/*.jpg|png|...` (see `folder_listing`) as (paths, labels,
    class names)."""
    listing = folder_listing(root, split, allow_empty_classes, hold_out)
    return list(listing.paths), list(listing.labels), list(listing.classes)


class FolderReader(Reader):
    """Reads `folder:PATH`. Unshuffled (evaluation) reads come in a fixed random order rather
    than sorted by class, so that reading only the first batches samples every class."""

    def root(self) -> str | os.PathLike:
        return self.argument

    def repair(self, root: str | os.PathLike) -> str | None:
        """How to repair the folder's data if an image in it is unreadable, for folders the
        library wrote itself (their count is exact: see `Records`); None for the user's own
        folders, whose unreadable images are skipped and counted."""
        return None

    def _info(self, split: str, listing: Listing) -> DatasetInfo:
        return DatasetInfo(self.source, split, len(listing.paths), len(listing.classes),
                           listing.classes)

    def info(self, split: str) -> DatasetInfo:
        return self._info(split, folder_listing(self.root(), split, self.allow_empty_classes,
                                                self.hold_out))

    def records(self, split, *, input_context=None, shuffle_files=False, seed=None,
                image_size=224) -> Records:
        root = self.root()
        listing = folder_listing(root, split, self.allow_empty_classes, self.hold_out)
        info = self._info(split, listing)
        paths, labels = list(listing.paths), np.asarray(listing.labels, np.int32)
        if not shuffle_files:
            # The listing is sorted by class: its first N files are one or two classes. A fixed
            # permutation makes every prefix (what --eval_steps reads) a uniform random
            # sample, the same in every run.
            order = np.random.default_rng(EVAL_ORDER_SEED).permutation(len(paths))
            paths, labels = [paths[i] for i in order], labels[order]
        dataset = tf.data.Dataset.from_tensor_slices(
            {"name": paths, "data": paths, "label": labels})
        repair = self.repair(root)
        return Records(dataset, info, data_is_path=True, exact_count=repair is not None,
                       repair=repair or "")
