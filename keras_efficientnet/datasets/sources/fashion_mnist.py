"""`fashion_mnist`: Zalando's Fashion-MNIST from its four idx files, as Debian installs them.

60,000 training and 10,000 test images, 28x28 grayscale, 10 classes (Xiao, Rasul and Vollgraf
2017). Splits: `train` is the first 55,000 training images, `validation` the last 5,000, and
`test` the 10,000 test images, meant only for a final evaluation (`--eval_split=test`) once the
recipe is fixed on `validation`. Each image goes through the same uint8 pipeline as image
files: encoded as a grayscale PNG, decoded to RGB, cropped and resized.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import zlib
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_efficientnet.datasets.sources.base import DatasetInfo, Reader, Records

# Where `apt-get install dataset-fashion-mnist` puts the files (`dpkg -L` lists them).
DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
INSTALL = "sudo apt-get install dataset-fashion-mnist  (or: make data-fashion)"
# MD5 of each file's decompressed content. The dataset publishes the MD5 of its .gz files;
# Debian recompresses them (other .gz bytes, same content), so the check is on what they
# decompress to: the published .gz files decompress to exactly these (checked once against
# the originals; data/README.md lists both).
MD5 = {
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot")
# The last VALIDATION_EXAMPLES training images are the validation split.
VALIDATION_EXAMPLES = 5_000
SPLITS = {"train": "train", "validation": "train", "test": "t10k"}
# idx magic numbers: unsigned bytes, with 1 (labels) or 3 (images) dimensions.
IDX_MAGIC = {1: 0x00000801, 3: 0x00000803}


def idx_bytes(path: Path) -> bytes:
    """The content of an idx file, decompressed if it is gzip; a ValueError naming the file
    when the gzip stream is cut short or damaged."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as error:  # cut short; bad header, data or CRC
        raise ValueError(f"{path}: not a complete gzip file ({error}): truncated or damaged; "
                         f"reinstall it (`{INSTALL}`)") from None


def parse_idx(data: bytes, dims: int, where: str) -> np.ndarray:
    """An unsigned-byte idx array with `dims` dimensions (LeCun's MNIST format: big-endian
    int32 magic and sizes, then the bytes)."""
    header = 4 * (1 + dims)
    if len(data) < header or int.from_bytes(data[:4], "big") != IDX_MAGIC[dims]:
        raise ValueError(f"{where}: not an idx file of unsigned bytes with {dims} dimension(s)")
    shape = tuple(int.from_bytes(data[4 * (i + 1):4 * (i + 2)], "big") for i in range(dims))
    if len(data) != header + int(np.prod(shape)):
        raise ValueError(f"{where}: {len(data) - header} bytes of data for shape {shape}: "
                         f"truncated or padded")
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def _file(folder: Path, stem: str) -> Path:
    for path in (folder / f"{stem}.gz", folder / stem):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"Fashion-MNIST file {stem}(.gz) not found in {folder}; install the dataset with "
        f"`{INSTALL}`, or pass --data_dir=DIR holding the four idx files")


@functools.lru_cache(maxsize=4)
def _verified(path: Path, stem: str, dims: int, size: int, mtime_ns: int) -> np.ndarray:
    # Keyed by size and time too: a file replaced on disk is read and checked again.
    data = idx_bytes(path)
    digest = hashlib.md5(data).hexdigest()
    if digest != MD5[stem]:
        raise ValueError(f"{path}: MD5 of its content is {digest}, not Fashion-MNIST's "
                         f"{MD5[stem]}; reinstall it (`{INSTALL}`)")
    return parse_idx(data, dims, str(path))


def load(folder: str | os.PathLike, prefix: str) -> tuple[np.ndarray, np.ndarray, Path]:
    """(images uint8 [n, 28, 28], labels uint8 [n], image file) of `prefix` ('train' or
    't10k'), checked against the published content."""
    folder = Path(folder)
    arrays = []
    for kind, dims in (("images", 3), ("labels", 1)):
        path = _file(folder, f"{prefix}-{kind}-idx{dims}-ubyte")
        stat = path.stat()
        arrays.append(_verified(path, f"{prefix}-{kind}-idx{dims}-ubyte", dims, stat.st_size,
                                stat.st_mtime_ns))
    images, labels = arrays
    if len(images) != len(labels):
        raise ValueError(f"{folder}: {len(images)} {prefix} images but {len(labels)} labels")
    return images, labels, _file(folder, f"{prefix}-images-idx3-ubyte")


class FashionMnistReader(Reader):
    """Reads `fashion_mnist` from `data_dir` (default DEFAULT_DIR, Debian's)."""

    def _folder(self) -> Path:
        return Path(self.data_dir) if self.data_dir is not None else Path(DEFAULT_DIR)

    def _split(self, split: str) -> tuple[np.ndarray, np.ndarray, str, int]:
        if split not in SPLITS:
            raise ValueError(f"split {split!r} not in source 'fashion_mnist'; available: "
                             f"{sorted(SPLITS)} (test: only for a final evaluation)")
        images, labels, path = load(self._folder(), SPLITS[split])
        start = 0
        if split == "train":
            images, labels = images[:-VALIDATION_EXAMPLES], labels[:-VALIDATION_EXAMPLES]
        elif split == "validation":
            start = len(images) - VALIDATION_EXAMPLES
            images, labels = images[start:], labels[start:]
        return images, labels, str(path), start

    def info(self, split: str) -> DatasetInfo:
        images, _, _, _ = self._split(split)
        return DatasetInfo(self.source, split, len(images), len(CLASS_NAMES), CLASS_NAMES)

    def records(self, split, *, input_context=None, shuffle_files=False, seed=None,
                image_size=224) -> Records:
        if split == "test" and shuffle_files:
            raise ValueError("the 'test' split of fashion_mnist is only for a final evaluation "
                             "(--eval_split=test); train and fine-tune on 'train', choose on "
                             "'validation'")
        images, labels, path, start = self._split(split)
        info = DatasetInfo(self.source, split, len(images), len(CLASS_NAMES), CLASS_NAMES)
        indices = tf.data.Dataset.range(len(images))
        if shuffle_files:
            # The whole split fits in memory: a full permutation each epoch, before encoding.
            indices = indices.shuffle(len(images), seed=seed, reshuffle_each_iteration=True)
        images = tf.constant(images[..., None])
        labels = tf.constant(labels.astype(np.int32))

        def record(i):
            name = tf.strings.join([path, "#", tf.strings.as_string(i + start)])
            return {"name": name, "data": tf.io.encode_png(tf.gather(images, i)),
                    "label": tf.gather(labels, i)}

        dataset = indices.map(record, num_parallel_calls=tf.data.AUTOTUNE)
        # Encoded here from files checked against their MD5: every record decodes.
        return Records(dataset, info, exact_count=True,
                       repair=f"reinstall the Fashion-MNIST files (`{INSTALL}`)")
