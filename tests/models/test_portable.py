"""The model and layers import and build on JAX without importing TensorFlow.

Training under JAX is covered by running the whole model suite in the TF-free environment.
"""

import os
import subprocess
import sys

import keras
import pytest

SCRIPT = """
import sys
import numpy as np
import keras
import keras_efficientnet as ke
model = ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="layer", proxy_norm=True,
                        classes=3, input_shape=(32, 32, 3))
model(np.zeros((1, 32, 32, 3), "uint8"))
print(ke.count_macs(model))
assert "tensorflow" not in sys.modules, "TensorFlow was imported"
"""


@pytest.mark.slow  # the TF-free environment of `make test-jax` proves the same at no cost
def test_jax_backend_never_imports_tensorflow():
    pytest.importorskip("jax")
    env = dict(os.environ, KERAS_BACKEND="jax")
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip().splitlines()[-1]) > 0


def test_environment_without_tensorflow_really_has_none():
    # `make test-jax` runs in a virtualenv without TensorFlow and sets this variable, so the
    # JAX run cannot pass by accident in an environment that has it.
    if not os.environ.get("KE_EXPECT_NO_TENSORFLOW"):
        pytest.skip("only meaningful in the JAX-only environment")
    import importlib.util

    assert keras.backend.backend() == "jax"
    assert importlib.util.find_spec("tensorflow") is None


# Its point is JAX (make test-jax runs it). Under TensorFlow it is slow (13 s of make test,
# quiet), where the trainer and resume tests train this G16-LN+PN model against references.
@(pytest.mark.slow if keras.backend.backend() == "tensorflow" else lambda test: test)
def test_g16_proxy_norm_model_fits_one_batch_on_any_backend():
    # Memorising 8 images is a task any working model/optimizer pair solves: the loss must
    # fall well below its start, on TensorFlow and on JAX alike.
    import numpy as np

    import keras_efficientnet as ke

    keras.utils.set_random_seed(0)
    # Logits, not softmax probabilities: on JAX, Keras clips probabilities, so a saturated
    # softmax would stop the gradient (TensorFlow recovers the logits behind the softmax).
    model = ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="layer",
                            proxy_norm=True, classes=4, input_shape=(32, 32, 3),
                            dropout_rate=0.0, drop_connect_rate=0.0, classifier_activation=None)
    # XLA is slower on a CPU under TensorFlow, but JAX needs its jit to be usable at all.
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=keras.backend.backend() != "tensorflow")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (8, 32, 32, 3)).astype("uint8")
    labels = np.arange(8) % 4
    losses = [float(model.train_on_batch(images, labels)) for _ in range(20)]
    assert np.all(np.isfinite(losses))
    assert np.median(losses[-5:]) < 0.05 * losses[0]
