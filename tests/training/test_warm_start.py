"""`--weights`: a new run starts from a run's .keras (a new classifier for another class count),
keras.applications' ImageNet layout for G1-BN, and refuses a misfit in one line; and
--init_checkpoint takes a run directory or a run's model.keras."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from absl import flags

from keras_efficientnet.cli import train as cli
from keras_efficientnet.training import TrainConfig
from keras_efficientnet.training.builders import build_model
from keras_efficientnet.training.resume import load_weights_for
from keras_efficientnet.training.warm_start import check_weights_flag, warm_start
from tests.models.keras_applications_h5 import (
    randomized_keras_applications,
    write_keras_applications_h5,
)
from tests.reliability.clitools import REPO

pytestmark = pytest.mark.tf_only
TINY = "efficientnet-tiny-g16-lnpn"


def _donor(path, model=TINY, classes=3, seed=0):
    """A run's model.keras stand-in: the preset with perturbed (recognizable) weights."""
    keras.utils.set_random_seed(seed)
    donor = build_model(TrainConfig(model=model), 32, classes)
    rng = np.random.default_rng(seed)
    for v in donor.weights:
        v.assign(v.numpy() + rng.normal(0, 0.1, v.shape).astype("float32"))
    donor.save(path)
    return {v.path: v.numpy() for v in donor.weights}


def test_a_runs_keras_file_with_another_class_count_gets_a_new_classifier(tmp_path):
    donor = _donor(tmp_path / "donor.keras")
    keras.utils.set_random_seed(1)
    model = build_model(TrainConfig(model=TINY), 32, 5)
    head = {v.path: v.numpy() for v in model.weights if v.path.startswith("predictions/")}
    loaded = warm_start(model, TrainConfig(model=TINY, weights=str(tmp_path / "donor.keras")))
    assert loaded.endswith("(classifier new: 3 -> 5 classes)")
    for v in model.weights:
        expected = head[v.path] if v.path.startswith("predictions/") else donor[v.path]
        np.testing.assert_array_equal(v.numpy(), expected, err_msg=v.path)
    same = build_model(TrainConfig(model=TINY), 32, 3)
    warm_start(same, TrainConfig(model=TINY, weights=str(tmp_path / "donor.keras")))
    for v in same.weights:
        np.testing.assert_array_equal(v.numpy(), donor[v.path], err_msg=v.path)


def test_a_file_of_another_preset_is_one_line_naming_both(tmp_path):
    _donor(tmp_path / "gn.keras", model="efficientnet-tiny-g1-gn")
    model = build_model(TrainConfig(model=TINY), 32, 3)
    with pytest.raises(ValueError, match=r"--weights='.*gn.keras' holds efficientnet-tiny-g1-gn "
                                         r"with 3 classes, which does not fit "
                                         r"--model=efficientnet-tiny-g16-lnpn") as error:
        warm_start(model, TrainConfig(model=TINY, weights=str(tmp_path / "gn.keras")))
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="--weights='x.png': give 'imagenet'"):
        check_weights_flag("x.png")
    with pytest.raises(ValueError, match="--weights='none.keras': no such file"):
        TrainConfig(weights="none.keras")


def test_keras_applications_weights_load_into_g1_bn(tmp_path):
    reference = randomized_keras_applications("b0", input_shape=(32, 32, 3))
    path = write_keras_applications_h5(reference, tmp_path / "efficientnetb0.h5")
    config = TrainConfig(model="efficientnet-b0-g1-bn", weights=str(path))
    model = build_model(config, 32, 4)
    assert "keras.applications" in warm_start(model, config)
    np.testing.assert_array_equal(model.get_layer("stem_conv").kernel.numpy(),
                                  reference.get_layer("stem_conv").kernel.numpy())


def _main(*argv) -> int:
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", *map(str, argv)])
    try:
        return cli.main(["train"])
    finally:
        flags.FLAGS.unparse_flags()


# Slow (14 s of make test, quiet: a training run): make test keeps warm_start and
# check_weights_flag above, on the same donor file.
@pytest.mark.slow
def test_the_training_command_starts_from_weights_and_init_checkpoint_takes_a_run(tmp_path):
    donor = _donor(tmp_path / "donor.keras", classes=4)
    run = tmp_path / "run"
    # A learning rate of 1e-9 (and a model without BatchNorm statistics): the run's model.keras
    # holds the warm-started weights to 1e-6 (digits: 10 classes).
    assert _main(f"--flagfile={REPO / 'flags' / 'smoke.flags'}", "--mode=train",
                 "--optimizer=sgd", "--learning_rate=1e-9", "--weight_decay=0",
                 f"--model_dir={run}", f"--weights={tmp_path / 'donor.keras'}",
                 "--verbose=0") == 0
    saved = keras.models.load_model(run / "model.keras")
    for v in saved.weights:
        if not v.path.startswith("predictions/"):
            np.testing.assert_allclose(v.numpy(), donor[v.path], atol=1e-6, err_msg=v.path)
    assert saved.output_shape[-1] == json.loads((run / "config.json").read_text())[
        "num_classes"] == 10
    # --init_checkpoint: a run's model.keras, and a run directory (its latest checkpoint; the
    # run above's, so that one training run serves both).
    for source in (run / "model.keras", run):
        model = build_model(TrainConfig(model=TINY), 64, 10)
        loaded = load_weights_for(TrainConfig(model=TINY, init_checkpoint=str(source),
                                              mode="finetune"), model, averaged=False)
        # A directory: its latest checkpoint, not the model.keras beside it.
        assert loaded.startswith(str(source if source.suffix else run / "checkpoints")), loaded
        if source.suffix == ".keras":
            for ours, theirs in zip(model.get_weights(), saved.get_weights()):
                np.testing.assert_array_equal(ours, theirs)
