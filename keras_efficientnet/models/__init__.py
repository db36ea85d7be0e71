"""EfficientNet models, their presets and their multiply-accumulate counts.

The architecture tables and presets are plain Python and load at once; the Keras model and the
MAC counter load on first use (`keras_efficientnet.lazy`), so that the training config is
checked without Keras.
"""

from keras_efficientnet.lazy import lazy_face
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

# Public name -> (module, attribute), one line a name.
_EXPORTS = {
    "EfficientNet": (".efficientnet", "EfficientNet"),
    "count_macs": (".macs", "count_macs"),
    "layer_macs": (".macs", "layer_macs"),
}

__all__ = [
    "B0_STAGES", "PRESETS", "SCALING", "VARIANTS", "BlockSpec", "block_specs",
    "decode_predictions", "imagenet_class_names", "imagenet_classes", "list_presets",
    "preset_config", "preset_name", "round_filters", "round_repeats", *_EXPORTS]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
