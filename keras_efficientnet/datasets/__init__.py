"""Host input pipeline (tf.data): sources, per-example ops, batch mixing, and the composer.

`InputOptions`, the crop constants and the source table (`parse_source`) are plain Python and
load at once (the training config and the commands use them before TensorFlow loads); the
TensorFlow modules load on first use of a name they define.
"""

import importlib

from keras_efficientnet.datasets.options import (
    AREA_RANGE,
    ASPECT_RANGE,
    EVAL_RESIZE_RATIO,
    InputOptions,
)
from keras_efficientnet.datasets.source_table import SOURCE_TABLE, parse_source

# The TensorFlow modules, searched in this order for a name not defined above.
_TF_MODULES = ("pipeline", "preprocessing", "mixing", "sources")


def __getattr__(name):
    if name in __all__:
        for module_name in _TF_MODULES:
            module = importlib.import_module(f"keras_efficientnet.datasets.{module_name}")
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module 'keras_efficientnet.datasets' has no attribute {name!r}")


__all__ = [
    "AREA_RANGE",
    "ASPECT_RANGE",
    "EVAL_RESIZE_RATIO",
    "SKIPPED",
    "SOURCE_TABLE",
    "DatasetInfo",
    "InputOptions",
    "NoReadableImagesError",
    "SkipCounter",
    "center_crop",
    "center_crop_window",
    "cutmix",
    "cutmix_box",
    "cutmix_v1_lambda",
    "cutmix_with",
    "dataset_info",
    "decode",
    "decode_and_random_crop",
    "default_data_dir",
    "flip",
    "list_image_folder",
    "make_dataset",
    "mix_batch",
    "mixup",
    "mixup_coefficients",
    "mixup_with",
    "parse_source",
    "prepare_digits",
    "random_crop_window",
    "resize",
    "sample_beta",
    "sample_cutmix_lambda",
]
