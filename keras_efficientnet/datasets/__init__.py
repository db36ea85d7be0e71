"""Host input pipeline (tf.data): sources, per-example ops, batch mixing, and the composer."""

from keras_efficientnet.datasets.mixing import cutmix, cutmix_box, mix_batch, mixup, sample_beta
from keras_efficientnet.datasets.pipeline import (
    SKIPPED,
    NoReadableImagesError,
    SkipCounter,
    make_dataset,
)
from keras_efficientnet.datasets.preprocessing import (
    AREA_RANGE,
    ASPECT_RANGE,
    EVAL_RESIZE_RATIO,
    center_crop,
    center_crop_window,
    decode,
    decode_and_random_crop,
    flip,
    random_crop_window,
    resize,
)
from keras_efficientnet.datasets.sources import (
    DatasetInfo,
    dataset_info,
    default_data_dir,
    list_image_folder,
    parse_source,
    prepare_digits,
)

__all__ = [
    "AREA_RANGE",
    "ASPECT_RANGE",
    "EVAL_RESIZE_RATIO",
    "SKIPPED",
    "DatasetInfo",
    "NoReadableImagesError",
    "SkipCounter",
    "center_crop",
    "center_crop_window",
    "cutmix",
    "cutmix_box",
    "dataset_info",
    "decode",
    "decode_and_random_crop",
    "default_data_dir",
    "flip",
    "list_image_folder",
    "make_dataset",
    "mix_batch",
    "mixup",
    "parse_source",
    "prepare_digits",
    "random_crop_window",
    "resize",
    "sample_beta",
]
