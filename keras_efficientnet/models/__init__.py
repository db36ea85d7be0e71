"""EfficientNet models, their presets and their multiply-accumulate counts."""

from keras_efficientnet.models.efficientnet import (
    B0_STAGES,
    SCALING,
    VARIANTS,
    BlockSpec,
    EfficientNet,
    block_specs,
    round_filters,
    round_repeats,
)
from keras_efficientnet.models.macs import count_macs, layer_macs
from keras_efficientnet.models.presets import PRESETS, list_presets, preset_config, preset_name

__all__ = [
    "B0_STAGES", "PRESETS", "SCALING", "VARIANTS", "BlockSpec", "EfficientNet", "block_specs",
    "count_macs", "layer_macs", "list_presets", "preset_config", "preset_name", "round_filters",
    "round_repeats",
]
