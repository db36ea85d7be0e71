"""EfficientNet models, their presets and their multiply-accumulate counts.

The architecture tables and presets are plain Python and load at once; the Keras model and the
MAC counter load on first use (so that the training config is checked without Keras).
"""

import importlib

from keras_efficientnet.models.architecture import (
    B0_STAGES,
    SCALING,
    VARIANTS,
    BlockSpec,
    block_specs,
    round_filters,
    round_repeats,
)
from keras_efficientnet.models.imagenet_classes import (
    decode_predictions,
    imagenet_class_names,
    imagenet_classes,
)
from keras_efficientnet.models.presets import PRESETS, list_presets, preset_config, preset_name

_KERAS_MODULES = {"EfficientNet": "efficientnet", "count_macs": "macs", "layer_macs": "macs"}


def __getattr__(name):
    if name in _KERAS_MODULES:
        module = importlib.import_module(f"keras_efficientnet.models.{_KERAS_MODULES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'keras_efficientnet.models' has no attribute {name!r}")


__all__ = [
    "B0_STAGES", "PRESETS", "SCALING", "VARIANTS", "BlockSpec", "EfficientNet", "block_specs",
    "count_macs", "decode_predictions", "imagenet_class_names", "imagenet_classes", "layer_macs",
    "list_presets", "preset_config", "preset_name", "round_filters",
    "round_repeats",
]
