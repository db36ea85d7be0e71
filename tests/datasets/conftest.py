"""Fixtures for the host pipeline tests: tiny image folders whose images say who they are."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image


def encode(array: np.ndarray, fmt: str, quality: int = 95) -> bytes:
    """PNG or JPEG bytes of a uint8 array (JPEG with 4:4:4 chroma so flat colours stay flat)."""
    buffer = io.BytesIO()
    if fmt == "png":
        Image.fromarray(array).save(buffer, format="PNG")
    else:
        Image.fromarray(array).save(buffer, format="JPEG", quality=quality, subsampling=0)
    return buffer.getvalue()


class Folder:
    """An image folder root/<split>/<class>/NNN.{png,jpg} of flat-coloured images.

    Image k has red level `values[k]` everywhere, so any crop, flip or resize of it still
    shows `values[k]`, and `identify` maps a decoded image back to its file.
    """

    def __init__(self, root, classes=("cat", "dog", "owl"), counts=None, size=(24, 32)):
        self.root = str(root)
        counts = counts or {"train": 4, "validation": 2}
        total = len(classes) * sum(counts.values())
        # Levels at least 8 apart, so JPEG's +-1 never confuses two images.
        levels = np.linspace(8, 248, total).round().astype(int)
        assert np.min(np.diff(levels)) >= 8
        self.items = {split: [] for split in counts}  # split -> [(path, label, level)]
        k = 0
        for split, count in counts.items():
            for label, name in enumerate(classes):
                folder = os.path.join(self.root, split, name)
                os.makedirs(folder, exist_ok=True)
                for i in range(count):
                    fmt = "png" if (k % 2) else "jpg"
                    value = int(levels[k])
                    array = np.zeros(size + (3,), np.uint8)
                    array[..., 0] = value
                    array[..., 1] = 255 - value
                    array[..., 2] = 40 * label
                    path = os.path.join(folder, f"{i:03d}.{fmt}")
                    with open(path, "wb") as f:
                        f.write(encode(array, fmt))
                    self.items[split].append((path, label, value))
                    k += 1

    def levels(self, split):
        return np.array([value for _, _, value in self.items[split]])

    def labels(self, split):
        return np.array([label for _, label, _ in self.items[split]])

    def identify(self, split, images) -> np.ndarray:
        """Index into `items[split]` of each image in a batch, by its mean red level."""
        red = np.asarray(images)[..., 0].reshape(len(images), -1).mean(axis=1)
        return np.abs(red[:, None] - self.levels(split)[None, :]).argmin(axis=1)


@pytest.fixture
def folder(tmp_path):
    return Folder(tmp_path / "photos")


@pytest.fixture
def make_folder(tmp_path):
    def make(name="photos", **kwargs):
        return Folder(tmp_path / name, **kwargs)

    return make


@pytest.fixture
def encode_image():
    return encode
