"""`digits`: scikit-learn's digits written once as an image folder, and where it goes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from keras_efficientnet.datasets import dataset_info, make_dataset, prepare_digits, sources


def collect(dataset):
    pairs = [(x.numpy(), y.numpy()) for x, y in dataset]
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    prepare_digits(data_dir)
    return data_dir


def test_digits_are_the_real_scikit_learn_digits_in_ten_classes(digits_dir):
    from sklearn.datasets import load_digits

    train = dataset_info("digits", "train", data_dir=digits_dir)
    validation = dataset_info("digits", "validation", data_dir=digits_dir)
    assert train.num_classes == validation.num_classes == 10
    assert train.class_names == tuple(str(d) for d in range(10))
    assert train.num_examples + validation.num_examples == 1797
    assert abs(validation.num_examples / 1797 - 0.2) < 0.01
    # Through the pipeline at 32x32 with no resize, each image must be its scikit-learn digit.
    dataset = make_dataset("digits", "validation", image_size=32, batch_size=64, training=False,
                           data_dir=digits_dir, eval_resize_ratio=1.0)
    images, labels = collect(dataset)
    assert images.shape == (validation.num_examples, 32, 32, 3)
    assert set(labels) == set(range(10))
    digits = load_digits()
    reference = np.round(digits.images * 255 / 16).astype(np.uint8)
    reference = np.repeat(np.repeat(reference, 4, axis=1), 4, axis=2)
    lookup = {ref.tobytes(): label for ref, label in zip(reference, digits.target)}
    for image, label in zip(images, labels):
        assert np.array_equal(image[..., 0], image[..., 2])  # grey, stored as RGB
        assert lookup[image[..., 0].tobytes()] == label
    assert images.std() > 50  # ink on background, not blank


def test_digits_are_written_once_and_atomically(digits_dir):
    root = os.path.join(digits_dir, "digits")
    marker = os.path.join(root, ".complete")
    stamp = os.path.getmtime(marker)
    assert str(prepare_digits(digits_dir)) == root
    assert os.path.getmtime(marker) == stamp
    assert not [n for n in os.listdir(digits_dir) if n.startswith(".digits-")]  # no leftovers


def test_digits_refuse_to_reuse_a_half_written_folder(tmp_path):
    os.makedirs(tmp_path / "digits" / "train")
    with pytest.raises(FileExistsError, match="not a complete digits folder"):
        prepare_digits(tmp_path)


def test_default_data_dir_is_the_env_override_else_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(sources.DATA_DIR_ENV, str(tmp_path / "mine"))
    assert sources.default_data_dir() == tmp_path / "mine"
    monkeypatch.delenv(sources.DATA_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert sources.default_data_dir() == tmp_path / "xdg" / "keras_efficientnet"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid under XDG: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert sources.default_data_dir() == tmp_path / "home" / ".cache" / "keras_efficientnet"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert sources.default_data_dir() == tmp_path / "home" / ".cache" / "keras_efficientnet"
    # Never the source tree (it used to be <repo>/data in a writable checkout).
    package = os.path.dirname(os.path.dirname(os.path.abspath(sources.__file__)))
    assert not str(sources.default_data_dir()).startswith(os.path.dirname(package))
