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
