"""InputOptions: one frozen value for make_dataset, its resolved defaults and its checks."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import numpy as np
import pytest

from keras_efficientnet.datasets.options import EVAL_RESIZE_RATIO, InputOptions


def test_defaults_resolve_from_training_and_mixing():
    train = InputOptions("digits", "train", image_size=32, batch_size=8, training=True)
    assert (train.augments, train.mixes, train.one_hot_labels, train.drops_remainder,
            train.keeps_order) == (True, False, False, True, False)
    mixed = train.replace(mixup_alpha=0.2)
    assert (mixed.mixes, mixed.one_hot_labels) == (True, True)
    # Graphcore's fine-tune input: evaluation crops, shuffled, mixed.
    tune = mixed.replace(augment=False, mix=True)
    assert (tune.augments, tune.mixes) == (False, True)
    evaluation = mixed.replace(split="validation", training=False)
    # Evaluation keeps its order and its labels one-hot (same loss as training) but never mixes.
    assert (evaluation.augments, evaluation.mixes, evaluation.one_hot_labels,
            evaluation.drops_remainder, evaluation.keeps_order) == (False, False, True, False,
                                                                   True)
    assert train.replace(seed=3).keeps_order and not train.replace(deterministic=False,
                                                                   seed=3).keeps_order


def test_frozen_and_checked_again_on_replace():
    options = InputOptions("digits", "train", image_size=32, batch_size=8, training=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.batch_size = 4
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        options.replace(batch_size=0)
    with pytest.raises(ValueError, match="mixup_alpha must be >= 0"):
        options.replace(mixup_alpha=float("nan"))
    assert InputOptions("digits", "train", image_size=np.int64(8), batch_size=2,
                        training=False).image_size == 8


def test_the_eval_resize_ratio_is_256_over_224_and_shared():
    from keras_efficientnet.cli import predict
    from keras_efficientnet.datasets import preprocessing
    from keras_efficientnet.training.config import TrainConfig

    assert EVAL_RESIZE_RATIO == 256 / 224
    assert preprocessing.EVAL_RESIZE_RATIO is EVAL_RESIZE_RATIO
    assert TrainConfig().eval_resize_ratio == EVAL_RESIZE_RATIO
    assert inspect.signature(predict.predict).parameters["resize_ratio"].default == (
        EVAL_RESIZE_RATIO)
    assert predict.build_parser().get_default("resize_ratio") == EVAL_RESIZE_RATIO


def test_options_load_without_tensorflow():
    # The module by its file (the package face imports the models, and so Keras).
    from keras_efficientnet.datasets import options

    code = ("import importlib.util, sys; "
            f"spec = importlib.util.spec_from_file_location('options', {options.__file__!r}); "
            "module = sys.modules['options'] = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(module); "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
            "print(module.EVAL_RESIZE_RATIO)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout) == 256 / 224


def test_make_dataset_takes_the_options_or_the_same_fields_as_keywords(folder):
    from keras_efficientnet.datasets import make_dataset

    fields = dict(image_size=8, batch_size=4, training=True, seed=5, mixup_alpha=0.3)
    options = InputOptions(f"folder:{folder.root}", "train", **fields)
    a = next(iter(make_dataset(options)))
    b = next(iter(make_dataset(f"folder:{folder.root}", "train", **fields)))
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
    np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())
    with pytest.raises(TypeError, match="options.replace"):
        make_dataset(options, "validation")
