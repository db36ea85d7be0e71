"""Optimizers (RMSPropTF, LARS, momentum SGD) and learning-rate schedules for the trainer."""

from keras_efficientnet.optimizers.lars import LARS
from keras_efficientnet.optimizers.rmsprop_tf import RMSPropTF
from keras_efficientnet.optimizers.schedules import WarmupSchedule, scaled_learning_rate
from keras_efficientnet.optimizers.sgd import SGD
from keras_efficientnet.optimizers.weight_decay import (
    BIAS_PATTERNS,
    DEFAULT_LARS_EXCLUDE,
    DEFAULT_WEIGHT_DECAY_EXCLUDE,
    NORM_SCALE_SHIFT_PATTERNS,
    excluded_mask,
    is_excluded,
    variable_path,
)

__all__ = [
    "BIAS_PATTERNS",
    "DEFAULT_LARS_EXCLUDE",
    "DEFAULT_WEIGHT_DECAY_EXCLUDE",
    "LARS",
    "NORM_SCALE_SHIFT_PATTERNS",
    "SGD",
    "RMSPropTF",
    "WarmupSchedule",
    "excluded_mask",
    "is_excluded",
    "scaled_learning_rate",
    "variable_path",
]
