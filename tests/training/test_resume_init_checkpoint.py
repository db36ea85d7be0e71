"""training.resume: the weights of --init_checkpoint, and the one line when they do not fit."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest

from keras_efficientnet.training import TrainConfig
from keras_efficientnet.training.builders import build_model
from keras_efficientnet.training.evaluation import load_model_file
from keras_efficientnet.training.resume import load_weights_for

pytestmark = pytest.mark.tf_only
TINY = "efficientnet-tiny-g16-lnpn"


def test_a_weights_file_loads_and_one_of_another_class_count_is_one_line(tmp_path):
    keras.utils.set_random_seed(0)
    donor = build_model(TrainConfig(model=TINY), 32, 3)
    donor.save_weights(tmp_path / "donor.weights.h5")
    # model_dir is the test's own: the default (runs/default, relative to the working directory)
    # is where `make train` writes, and --mode=evaluate names the model from its config.json.
    config = TrainConfig(model=TINY, init_checkpoint=str(tmp_path / "donor.weights.h5"),
                         mode="evaluate", model_dir=str(tmp_path / "run"))
    same = build_model(config, 32, 3)
    assert load_weights_for(config, same) == str(tmp_path / "donor.weights.h5")
    for got, want in zip(same.get_weights(), donor.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    other = build_model(config, 32, 5)
    # One line and nothing before it: a warning Keras gives on the way (it has, of the skipped
    # layers) would be raised here instead of the ValueError.
    with pytest.raises(ValueError) as error, warnings.catch_warnings():
        warnings.simplefilter("error")
        load_weights_for(config, other)
    line = str(error.value)
    # The head holds (channels, 5); the file's is (channels, 3).
    channels = donor.get_layer("predictions").kernel.shape[0]
    assert line == (f"--init_checkpoint={str(tmp_path / 'donor.weights.h5')!r} does not fit "
                    f"--model={TINY} with 5 classes: A total of 1 objects could not be loaded: "
                    f"layer 'predictions' (Dense) holds ({channels}, 5), the file "
                    f"({channels}, 3)")
    assert "\n" not in line and len(line) < 400
    # The --mode=evaluate loader says the same, naming the file.
    with pytest.raises(ValueError) as same_error:
        load_model_file(other, tmp_path / "donor.weights.h5", config)
    assert str(same_error.value) == line.replace(
        f"--init_checkpoint={str(tmp_path / 'donor.weights.h5')!r}",
        str(tmp_path / "donor.weights.h5"))
