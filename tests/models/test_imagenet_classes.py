"""ImageNet's class names as package data: the file matches its source, and decode_predictions
ranks like keras.applications' (same tuple layout), without TensorFlow."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet.models.imagenet_classes import imagenet_class_names, imagenet_classes

REPO = Path(__file__).resolve().parents[2]


def test_known_classes_are_at_their_imagenet_labels():
    classes = imagenet_classes()
    assert len(classes) == 1000 and len({c.wnid for c in classes}) == 1000
    # Facts of the ILSVRC 2012 label order, from its synset list.
    assert classes[0] == ("n01440764", "tench", "tench, Tinca tinca")
    assert classes[207][:2] == ("n02099601", "golden retriever")
    assert classes[281][:2] == ("n02123045", "tabby")
    assert classes[999][:2] == ("n15075141", "toilet tissue")
    assert [c.wnid for c in classes] == sorted(c.wnid for c in classes)
    names = imagenet_class_names()
    assert len(set(names)) == 1000  # short names tell every class apart ("maillot" twice)
    assert names[638:640] == ["maillot", "maillot, tank suit"]


def test_decode_predictions_ranks_each_row():
    rng = np.random.default_rng(0)
    predictions = rng.random((2, 1000)).astype("float32")
    predictions[1, 281] = 5.0
    decoded = ke.decode_predictions(predictions, top=3)
    for row, top in zip(predictions, decoded):
        best = np.argsort(row)[::-1][:3]
        assert [wnid for wnid, _, _ in top] == [imagenet_classes()[i].wnid for i in best]
        assert [score for _, _, score in top] == pytest.approx(row[best].tolist())
    assert decoded[1][0] == ("n02123045", "tabby", 5.0)
    with pytest.raises(ValueError, match=r"shape \[batch, 1000\], received shape \(2, 10\)"):
        ke.decode_predictions(np.zeros((2, 10)))


def test_the_file_matches_its_source():
    pytest.importorskip("tensorflow_datasets")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "imagenet_classes.py"),
                           "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
