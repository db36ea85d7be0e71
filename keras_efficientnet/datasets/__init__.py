"""Host input pipeline (tf.data): sources, per-example ops, batch mixing, and the composer.

`InputOptions`, the crop constants and the source table (`parse_source`) are plain Python and
load at once (the training config and the commands use them before TensorFlow loads); the
TensorFlow modules load on first use of a name they define (`keras_efficientnet.lazy`).
"""

from keras_efficientnet.datasets.options import (
    AREA_RANGE,
    ASPECT_RANGE,
    EVAL_RESIZE_RATIO,
    InputOptions,
)
from keras_efficientnet.datasets.source_table import SOURCE_TABLE, parse_source
from keras_efficientnet.lazy import lazy_face

# Public name -> (module, attribute), one line a name, loaded on first use.
_EXPORTS = {
    "SKIPPED": (".pipeline", "SKIPPED"),
    "DamagedDataError": (".pipeline", "DamagedDataError"),
    "NoReadableImagesError": (".pipeline", "NoReadableImagesError"),
    "SkipCounter": (".pipeline", "SkipCounter"),
    "make_dataset": (".pipeline", "make_dataset"),
    "center_crop": (".preprocessing", "center_crop"),
    "center_crop_window": (".preprocessing", "center_crop_window"),
    "decode": (".preprocessing", "decode"),
    "decode_and_random_crop": (".preprocessing", "decode_and_random_crop"),
    "flip": (".preprocessing", "flip"),
    "random_crop_window": (".preprocessing", "random_crop_window"),
    "resize": (".preprocessing", "resize"),
    "cutmix": (".mixing", "cutmix"),
    "cutmix_box": (".mixing", "cutmix_box"),
    "cutmix_v1_lambda": (".mixing", "cutmix_v1_lambda"),
    "cutmix_with": (".mixing", "cutmix_with"),
    "mix_batch": (".mixing", "mix_batch"),
    "mixup": (".mixing", "mixup"),
    "mixup_coefficients": (".mixing", "mixup_coefficients"),
    "mixup_with": (".mixing", "mixup_with"),
    "sample_beta": (".mixing", "sample_beta"),
    "sample_cutmix_lambda": (".mixing", "sample_cutmix_lambda"),
    "DatasetInfo": (".sources", "DatasetInfo"),
    "dataset_info": (".sources", "dataset_info"),
    "default_data_dir": (".sources", "default_data_dir"),
    "list_image_folder": (".sources", "list_image_folder"),
    "prepare_digits": (".sources", "prepare_digits"),
}

__all__ = ["AREA_RANGE", "ASPECT_RANGE", "EVAL_RESIZE_RATIO", "InputOptions", "SOURCE_TABLE",
           "parse_source", *_EXPORTS]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
