"""--eval_flip: evaluation scores each image as the mean probabilities of it and its mirror."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_efficientnet.training import TrainConfig, trainer
from keras_efficientnet.training.builders import build_datasets, flip_averaged
from tests.helpers import softmax

pytestmark = pytest.mark.tf_only


def test_flip_averaged_logits_are_the_log_of_the_mean_probability():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3), dtype="uint8")
    logits = keras.layers.Dense(5, kernel_initializer=keras.initializers.RandomNormal(0, 0.002))(
        keras.layers.Flatten()(keras.ops.cast(inputs, "float32")))
    model = keras.Model(inputs, logits)
    images = np.random.default_rng(0).integers(0, 256, (3, 8, 8, 3)).astype("uint8")
    averaged = np.asarray(flip_averaged(model)(images), "float64")
    probabilities = softmax(np.asarray(model(images), "float64"))
    mean = (probabilities + softmax(np.asarray(model(images[:, :, ::-1]), "float64"))) / 2
    np.testing.assert_allclose(averaged, np.log(mean), atol=1e-5)
    # The mirror is left-right (the width axis), not upside down, and not the image itself.
    upside_down = (probabilities + softmax(np.asarray(model(images[:, ::-1]), "float64"))) / 2
    assert np.abs(softmax(averaged) - upside_down).max() > 0.05
    assert np.abs(softmax(averaged) - probabilities).max() > 0.05


# Slow (17 s of make test, quiet: a training run): make test keeps flip_averaged against its
# closed form above.
@pytest.mark.slow
def test_a_run_reports_one_pass_and_flip_scores_side_by_side(tmp_path):
    config = TrainConfig(model="efficientnet-tiny-g1-bn", dataset="digits", train_resolution=32,
                         test_resolution=32, micro_batch_size=16, updates_per_epoch=3,
                         epochs=1, eval_steps=2, verbose=0, optimizer="sgd", learning_rate=0.05,
                         warmup_epochs=0.0, label_smoothing=0.0, drop_connect_rate=0.0,
                         dropout_rate=0.0, eval_flip=True, seed=1,
                         model_dir=str(tmp_path / "run"))
    results = trainer.train_and_evaluate(config)
    # The shipped model (softmax outputs) on the same evaluation batches, by NumPy.
    model = keras.saving.load_model(tmp_path / "run" / "model.keras")
    data = build_datasets(config, 32, training=False, split=config.eval_split, repeat=False,
                          num_classes=10)
    plain, flipped, labels = [], [], []
    for images, batch_labels in data.take(config.eval_steps):
        plain.append(np.asarray(model(images.numpy())))
        flipped.append(np.asarray(model(images.numpy()[:, :, ::-1])))
        labels.append(batch_labels.numpy())
    plain, flipped, labels = np.concatenate(plain), np.concatenate(flipped), np.concatenate(labels)
    mean = (plain + flipped) / 2
    rows = np.arange(len(labels))
    assert results["top1"] == pytest.approx((plain.argmax(-1) == labels).mean())
    assert results["flip_top1"] == pytest.approx((mean.argmax(-1) == labels).mean())
    assert results["loss"] == pytest.approx(-np.log(plain[rows, labels]).mean(), rel=1e-4)
    assert results["flip_loss"] == pytest.approx(-np.log(mean[rows, labels]).mean(), rel=1e-4)
    assert results["flip_loss"] != pytest.approx(results["loss"], rel=1e-3)
