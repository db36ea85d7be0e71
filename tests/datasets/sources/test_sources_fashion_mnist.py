"""`fashion_mnist`: idx files written here and read back; the real files where installed."""

from __future__ import annotations

import gzip
import hashlib
import os

import numpy as np
import pytest

from keras_efficientnet.datasets import dataset_info, make_dataset
from keras_efficientnet.datasets.sources import fashion_mnist

REAL = fashion_mnist.DEFAULT_DIR
STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")


def _idx(array: np.ndarray) -> bytes:
    # Written by hand from LeCun's format description: magic 0x0000080<dims>, sizes, bytes.
    magic = bytes([0, 0, 8, array.ndim])
    sizes = b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return magic + sizes + array.astype(np.uint8).tobytes()


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """Six training and three test 28x28 images whose pixel (0, 0) is 40 * index + 1 (test:
    +200), labels 0..; train gzip-compressed, test plain; MD5s and the validation size set
    for them."""
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8)
    train[:, 0, 0] = 40 * np.arange(6) + 1
    test = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    test[:, 0, 0] = 40 * np.arange(3) + 200 - 80
    arrays = {STEMS[0]: train, STEMS[1]: np.array([3, 1, 4, 1, 5, 9]),
              STEMS[2]: test, STEMS[3]: np.array([2, 7, 1])}
    md5 = {}
    for stem, array in arrays.items():
        data = _idx(array)
        md5[stem] = hashlib.md5(data).hexdigest()
        if stem.startswith("train"):
            (tmp_path / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (tmp_path / stem).write_bytes(data)
    monkeypatch.setattr(fashion_mnist, "MD5", md5)
    monkeypatch.setattr(fashion_mnist, "VALIDATION_EXAMPLES", 2)
    return tmp_path, arrays


def _read(folder, split, **kwargs):
    batches = list(make_dataset("fashion_mnist", split, image_size=28, batch_size=10,
                                training=False, eval_resize_ratio=1.0, data_dir=folder,
                                **kwargs))
    return (np.concatenate([x.numpy() for x, _ in batches]),
            np.concatenate([y.numpy() for _, y in batches]))


def test_a_tiny_idx_file_is_written_and_read_back(tiny):
    folder, arrays = tiny
    assert fashion_mnist.parse_idx(_idx(arrays[STEMS[0]]), 3, "x").tolist() == arrays[
        STEMS[0]].tolist()
    for split, stem, rows in (("train", STEMS[0], slice(0, 4)),
                              ("validation", STEMS[0], slice(4, 6)),
                              ("test", STEMS[2], slice(0, 3))):
        images, labels = _read(folder, split)
        expected = arrays[stem][rows]
        # The same uint8 pipeline: grayscale to RGB, pixels unchanged at the native size.
        assert images.shape == (len(expected), 28, 28, 3)
        np.testing.assert_array_equal(images, np.repeat(expected[..., None], 3, axis=-1))
        np.testing.assert_array_equal(labels, arrays[stem.replace("images-idx3",
                                                                  "labels-idx1")][rows])
    info = dataset_info("fashion_mnist", "validation", data_dir=folder)
    assert (info.num_examples, info.num_classes, info.class_names[9]) == (2, 10, "Ankle boot")


def test_training_reads_each_image_once_per_epoch_shuffled(tiny):
    folder, arrays = tiny
    first = [make_dataset("fashion_mnist", "train", image_size=16, batch_size=4,
                          training=True, seed=s, data_dir=folder) for s in (0, 0)]
    a, b = (next(iter(d)) for d in first)
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())  # same seed, same batch
    assert sorted(a[1].numpy().tolist()) == sorted(arrays[STEMS[1]][:4].tolist())


def test_damaged_missing_or_wrong_files_are_one_line(tiny):
    folder, _ = tiny
    with pytest.raises(ValueError, match=r"split 'valid' not in source 'fashion_mnist'; "
                                         r"available: \['test', 'train', 'validation'\]"):
        dataset_info("fashion_mnist", "valid", data_dir=folder)
    (folder / STEMS[2]).write_bytes((folder / STEMS[2]).read_bytes()[:-1])
    with pytest.raises(ValueError, match=f"{folder / STEMS[2]}: MD5 of its content is "
                                         f"[0-9a-f]{{32}}, not Fashion-MNIST's"):
        dataset_info("fashion_mnist", "test", data_dir=folder)
    os.remove(folder / STEMS[2])
    with pytest.raises(FileNotFoundError, match=r"t10k-images-idx3-ubyte\(.gz\) not found in "
                                                r".*apt-get install dataset-fashion-mnist"):
        dataset_info("fashion_mnist", "test", data_dir=folder)
    with pytest.raises(ValueError, match="'test' split of fashion_mnist is only for a final "):
        make_dataset("fashion_mnist", "test", image_size=8, batch_size=2, training=True,
                     data_dir=folder)
    with pytest.raises(ValueError, match="truncated or padded"):
        fashion_mnist.parse_idx(_idx(np.zeros((2, 3, 3)))[:-1], 3, "x")
    gz = folder / f"{STEMS[0]}.gz"
    whole = gz.read_bytes()
    flipped = whole[:-8] + bytes([whole[-8] ^ 1]) + whole[-7:]  # the CRC-32 no longer fits
    for damaged in (whole[:len(whole) // 2], whole[:-4], flipped):
        gz.write_bytes(damaged)
        with pytest.raises(ValueError, match=f"^{gz}: not a complete gzip file .*: truncated "
                                             "or damaged; reinstall it"):
            dataset_info("fashion_mnist", "train", data_dir=folder)
    with pytest.raises(ValueError, match="not an idx file"):
        fashion_mnist.parse_idx(_idx(np.zeros((2, 3, 3))), 1, "x")


@pytest.mark.skipif(not os.path.isdir(REAL), reason=f"Fashion-MNIST is not installed in {REAL} "
                    "(make data-fashion, or: apt-get install dataset-fashion-mnist)")
def test_the_real_files_match_the_published_content_and_split_55000_5000_10000():
    def labels(stem):  # an independent read: gzip, skip the 8-byte header
        with gzip.open(os.path.join(REAL, f"{stem}.gz")) as f:
            return np.frombuffer(f.read(), np.uint8, offset=8)

    train, test = labels(STEMS[1]), labels(STEMS[3])
    assert (len(train), len(test)) == (60_000, 10_000)
    assert np.bincount(train).tolist() == [6000] * 10 and np.bincount(test).tolist() == [1000] * 10
    sizes = {s: dataset_info("fashion_mnist", s).num_examples for s in
             ("train", "validation", "test")}
    assert sizes == {"train": 55_000, "validation": 5_000, "test": 10_000}
    _, got = _read(REAL, "validation")
    np.testing.assert_array_equal(got, train[55_000:])
