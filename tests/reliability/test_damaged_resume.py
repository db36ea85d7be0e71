"""Issue 21's acceptance test: damage, in turn, each file of the newest checkpoint; the run
resumes from the previous one and ends with weights bit-equal to a run resumed there directly
(weights, optimizer, random-generator state and weight average)."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from keras_efficientnet.training import TrainConfig, trainer
from keras_efficientnet.training.checkpoint import MANIFEST

pytestmark = [pytest.mark.tf_only, pytest.mark.slow]  # ~9 tiny training runs, ~1 min

TINY = dict(model="efficientnet-tiny-g16-lnpn", dataset="synthetic", train_resolution=32,
            test_resolution=32, micro_batch_size=8, updates_per_epoch=2, eval_steps=1, verbose=0,
            optimizer="sgd", learning_rate=0.01, lr_schedule="cosine", warmup_epochs=0.5,
            label_smoothing=0.1, drop_connect_rate=0.3, dropout_rate=0.3, keep_checkpoints=5,
            seed=3, resume=True)
FILES = ["model.weights.h5", "optimizer.npz", "average.npz", "rng.npz", "state.json", MANIFEST]


def _train(model_dir, epochs):
    config = TrainConfig(**{**TINY, "model_dir": str(model_dir), "epochs": epochs})
    return trainer.train(config, num_classes=10, train_examples=10_000)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run of 2 epochs (checkpoints epoch-0001, epoch-0002), and the reference: a copy with
    epoch-0002 removed, resumed from epoch-0001 directly to 3 epochs."""
    root = tmp_path_factory.mktemp("damaged")
    _train(root / "base", epochs=2)
    reference = root / "reference"
    shutil.copytree(root / "base", reference)
    shutil.rmtree(reference / "checkpoints" / "epoch-0002")
    (reference / "checkpoints" / "LATEST").write_text("epoch-0001")
    return root, _train(reference, epochs=3)


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", FILES)
def test_a_damaged_newest_checkpoint_resumes_from_the_previous_one_bit_exactly(runs, name,
                                                                                caplog):
    root, reference = runs
    run = root / f"damaged-{name}"
    shutil.copytree(root / "base", run)
    newest = run / "checkpoints" / "epoch-0002"
    assert sorted(p.name for p in newest.iterdir()) == sorted(FILES)
    _flip_a_byte(newest / name)

    with caplog.at_level(logging.WARNING, "keras_efficientnet"):
        resumed = _train(run, epochs=3)
    lines = [r.getMessage() for r in caplog.records if r.name == "keras_efficientnet"]
    assert len(lines) == 1 and lines[0].startswith(f"checkpoint {newest} is damaged: {name}")
    assert (run / "checkpoints" / "damaged" / "epoch-0002" / name).is_file()  # kept

    for a, b in zip(resumed["model"].get_weights(), reference["model"].get_weights(),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(resumed["average"].values, reference["average"].values, strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed["history"] == reference["history"]
