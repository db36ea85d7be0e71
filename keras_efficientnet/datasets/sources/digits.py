"""`digits`: scikit-learn's 1797 8x8 digits, written once as an image folder of 32x32 PNGs."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from keras_efficientnet.datasets.sources.base import default_data_dir
from keras_efficientnet.datasets.sources.folder import FolderReader

DIGITS_SIZE = 32  # 8x8 scikit-learn digits upscaled 4x (nearest), so small models can stride.
DIGITS_VALIDATION_EVERY = 5  # every 5th image of each class -> validation: a fixed 80/20 split.
_COMPLETE_MARKER = ".complete"


def _write_digits(root: Path) -> None:
    try:
        from PIL import Image
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError(f"the 'digits' dataset needs scikit-learn and pillow ({error}); "
                          "pip install 'keras-efficientnet[digits]'") from None

    digits = load_digits()
    # Values are ink counts 0..16: stretch to 0..255 and repeat to RGB so the folder reader sees
    # an ordinary colour image.
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    scale = DIGITS_SIZE // images.shape[1]
    seen_per_class = np.zeros(10, np.int64)
    for index, (image, label) in enumerate(zip(images, digits.target)):
        split = "validation" if seen_per_class[label] % DIGITS_VALIDATION_EVERY == (
            DIGITS_VALIDATION_EVERY - 1) else "train"
        seen_per_class[label] += 1
        big = np.kron(image, np.ones((scale, scale), np.uint8))
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.stack([big] * 3, axis=-1)).save(folder / f"{index:04d}.png")


def prepare_digits(data_dir: str | os.PathLike | None = None) -> Path:
    """Writes scikit-learn's 1797 8x8 digits once as `<data_dir>/digits/{train,validation}/<d>/`
    PNGs (`data_dir` default: `default_data_dir()`) and returns that folder; later calls return
    at once.

    Written into a temporary sibling and renamed into place, so an interrupted write never
    leaves a half folder and concurrent writers are harmless.
    """
    root = Path(data_dir if data_dir is not None else default_data_dir()) / "digits"
    if (root / _COMPLETE_MARKER).is_file():
        return root
    if root.exists():
        raise FileExistsError(f"{root} exists but is not a complete digits folder (no "
                              f"{_COMPLETE_MARKER} marker); delete it and it will be rewritten")
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".digits-", dir=root.parent))
    try:
        _write_digits(staging)
        (staging / _COMPLETE_MARKER).write_text("scikit-learn load_digits, 80/20 split\n")
        try:
            os.rename(staging, root)
        except OSError:
            if not (root / _COMPLETE_MARKER).is_file():  # lost a race to a complete writer: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


class DigitsReader(FolderReader):
    """Reads `digits`: the folder `prepare_digits(data_dir)` writes, as any image folder."""

    def root(self) -> Path:
        return prepare_digits(self.data_dir)

    def repair(self, root: str | os.PathLike) -> str:
        # The library wrote these PNGs (complete, behind a marker): an unreadable one is damage.
        return f"delete the folder {str(root)!r} and it will be rewritten"
