"""Default exclusion regexes against the variable paths the EfficientNet model produces."""

import keras
import pytest

from keras_efficientnet.optimizers import (
    DEFAULT_LARS_EXCLUDE,
    DEFAULT_WEIGHT_DECAY_EXCLUDE,
    excluded_mask,
    is_excluded,
    variable_path,
)


class _Named:
    """Stands in for a raw backend variable: a `name`, no Keras `path`."""

    def __init__(self, name):
        self.name = name


# (path, excluded from RMSProp/SGD weight decay, excluded from LARS)
PATHS = [
    ("stem_conv/kernel", False, False),
    ("block1a/dwconv/depthwise_kernel", False, False),
    ("block2a/group_conv/kernel", False, False),
    ("block2a/group_conv/bias", False, True),
    ("block1a/project_norm/gamma", True, True),
    ("block1a/project_norm/beta", True, True),
    ("block1a/se_reduce/bias", False, True),
    ("block2a/expand_pn/gamma", True, True),
    ("block2a/expand_pn/beta", True, True),
    ("block2a/expand_pn/proxy_gamma", False, False),
    ("block2a/expand_pn/proxy_beta", False, False),
    ("predictions/kernel", False, False),
    ("predictions/bias", False, True),
    ("gamma", True, True),  # a bare name (no scope) still matches a whole component
    ("gamma_kernel/kernel", False, False),  # ...but not a substring of another component
    ("my_bias/kernel", False, False),
]


@pytest.mark.parametrize("path, decay_excluded, lars_excluded", PATHS)
def test_default_patterns_on_model_paths(path, decay_excluded, lars_excluded):
    variable = _Named(path.split("/")[-1])
    variable.path = path
    assert is_excluded(variable, DEFAULT_WEIGHT_DECAY_EXCLUDE) is decay_excluded
    assert is_excluded(variable, DEFAULT_LARS_EXCLUDE) is lars_excluded


def test_path_of_keras_variables_in_a_layer_and_name_fallback():
    layer = keras.layers.BatchNormalization(name="stem_norm")
    layer.build((None, 4))
    assert [variable_path(v) for v in layer.trainable_weights] == [
        "stem_norm/gamma",
        "stem_norm/beta",
    ]
    assert excluded_mask(layer.trainable_weights, DEFAULT_LARS_EXCLUDE) == [True, True]
    # Without a Keras path (a raw TF variable), the name minus its ":0" output index is used.
    assert variable_path(_Named("dense/bias:0")) == "dense/bias"
    assert is_excluded(_Named("dense/bias:0"), DEFAULT_LARS_EXCLUDE)
    assert not is_excluded(_Named("dense/kernel:0"), DEFAULT_LARS_EXCLUDE)
    dense = keras.layers.Dense(2, name="head")
    dense.build((None, 3))
    assert excluded_mask(dense.trainable_weights, DEFAULT_LARS_EXCLUDE) == [False, True]


# Variable paths do not depend on the backend, and a first model build on JAX spends ~30 s on
# 2 CPU cores compiling its eager initializer ops, so this check runs on TensorFlow only.
@pytest.mark.skipif(keras.backend.backend() == "jax", reason="paths are backend-independent")
def test_masks_on_tiny_proxy_norm_efficientnet():
    # The model's real variable names: every norm / proxy-norm gamma and beta and every bias is
    # left out of LARS; the proxy parameters and all kernels are not. RMSProp's L2 additionally
    # decays biases.
    from keras_efficientnet import EfficientNet

    model = EfficientNet(
        "tiny",
        norm="group",
        proxy_norm=True,
        group_size=16,
        expand_ratio=4,
        input_shape=(32, 32, 3),
        classes=10,
    )
    variables = model.trainable_variables
    last = [variable_path(v).rsplit("/", 1)[-1] for v in variables]
    assert {"kernel", "bias", "gamma", "beta", "proxy_gamma", "proxy_beta"} <= set(last)
    lars = excluded_mask(variables, DEFAULT_LARS_EXCLUDE)
    decay = excluded_mask(variables, DEFAULT_WEIGHT_DECAY_EXCLUDE)
    assert lars == [name in ("gamma", "beta", "bias") for name in last]
    assert decay == [name in ("gamma", "beta") for name in last]
