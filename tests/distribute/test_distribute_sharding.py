"""Sharded training input: 2 workers together see every example of an epoch exactly once.

Through the trainer's own input builder with the `InputContext` a multi-worker runtime hands
each worker, on an image folder whose images each carry their own colour level
(tests/datasets/conftest.py), so every decoded, cropped and flipped image names its file.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.training import TrainConfig, trainer
from keras_efficientnet.training.runtime import skip_seen
from tests.datasets.conftest import Folder

EXAMPLES = 24  # 3 classes x 8


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return Folder(tmp_path_factory.mktemp("shards") / "photos",
                  counts={"train": EXAMPLES // 3, "validation": 1})


def _config(photos, workers: int) -> TrainConfig:
    return TrainConfig(dataset=f"folder:{photos.root}", model="efficientnet-tiny-g16-lnpn",
                       strategy="multiworker" if workers > 1 else "default", replicas=workers,
                       micro_batch_size=4, train_resolution=32, test_resolution=32,
                       random_flip=True, seed=7)


def _epochs(photos, workers: int, worker: int, epochs: int = 2) -> list[list[int]]:
    """Example ids one worker's pipeline yields, epoch by epoch."""
    config = _config(photos, workers)
    context = (tf.distribute.InputContext(num_input_pipelines=workers,
                                          input_pipeline_id=worker,
                                          num_replicas_in_sync=workers)
               if workers > 1 else None)
    data = trainer.build_datasets(config, 32, training=True, split="train", repeat=True,
                                  input_context=context)
    per_epoch = EXAMPLES // workers // (config.plan.examples_per_step_call // workers)
    ids = [photos.identify("train", images.numpy())
           for images, _ in data.take(epochs * per_epoch)]
    return [list(np.concatenate(ids[e * per_epoch:(e + 1) * per_epoch])) for e in range(epochs)]


def test_two_workers_see_every_example_of_an_epoch_exactly_once(photos):
    shard0, shard1 = _epochs(photos, 2, 0), _epochs(photos, 2, 1)
    for epoch in range(2):
        assert len(shard0[epoch]) == len(shard1[epoch]) == EXAMPLES // 2  # half each
        assert sorted(shard0[epoch] + shard1[epoch]) == list(range(EXAMPLES))
    # Shards are disjoint and fixed: a worker reshuffles its own files every epoch.
    assert set(shard0[0]) == set(shard0[1]) and shard0[0] != shard0[1]
    # One worker sees the whole epoch.
    (whole,) = _epochs(photos, 1, 0, epochs=1)
    assert sorted(whole) == list(range(EXAMPLES))


def test_per_epoch_shuffle_is_deterministic(photos):
    assert _epochs(photos, 2, 1) == _epochs(photos, 2, 1)


def test_resume_skips_exactly_the_batches_seen(photos):
    # After 1 epoch of 3 steps (one batch of this worker per step), a resumed pipeline starts
    # where the uninterrupted one is.
    config = _config(photos, 2)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0,
                                         num_replicas_in_sync=2)

    def data():
        return trainer.build_datasets(config, 32, training=True, split="train", repeat=True,
                                      input_context=context)

    uninterrupted = [photos.identify("train", x.numpy()) for x, _ in data().take(6)]
    resumed = skip_seen(data(), start_step=1 * 3)
    tail = [photos.identify("train", x.numpy()) for x, _ in resumed.take(3)]
    np.testing.assert_array_equal(np.concatenate(tail), np.concatenate(uninterrupted[3:]))
