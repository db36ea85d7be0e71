"""WarmupSchedule against a hand-computed table; scaled learning rate; config round trip."""

import math

import keras
import numpy as np
import pytest

from keras_efficientnet.optimizers import WarmupSchedule, scaled_learning_rate
from tests.helpers import assert_config_round_trip

EXPONENTIAL = {
    "base_learning_rate": 0.048,
    "warmup_steps": 10,
    "decay": "exponential",
    "decay_steps": 4,
    "decay_rate": 0.5,
}
POLYNOMIAL = {
    "base_learning_rate": 8.0,
    "warmup_steps": 10,
    "decay": "polynomial",
    "total_steps": 30,
    "end_learning_rate": 0.08,
    "power": 2.0,
}
COSINE = {
    "base_learning_rate": 1.0,
    "warmup_steps": 4,
    "decay": "cosine",
    "total_steps": 12,
    "end_learning_rate": 0.1,
}
CONSTANT = {"base_learning_rate": 0.1, "warmup_steps": 10, "warmup_start_learning_rate": 0.01}

# (schedule kwargs, step, expected rate), each worked out by hand.
TABLE = [
    (EXPONENTIAL, 0, 0.0),
    (EXPONENTIAL, 5, 0.024),  # warm-up midpoint
    (EXPONENTIAL, 10, 0.048),  # end of warm-up: full base rate
    (EXPONENTIAL, 13, 0.048),  # 3 steps after warm-up: no decay yet
    (EXPONENTIAL, 14, 0.024),  # 1 decay: periods count from the end of warm-up
    (EXPONENTIAL, 22, 0.006),  # 3 decays
    (EXPONENTIAL, 25, 0.006),  # still 3 (staircase)
    ({**EXPONENTIAL, "staircase": False}, 16, 0.048 * 0.5**1.5),
    ({**EXPONENTIAL, "decay_steps": 2.5}, 15, 0.012),  # fractional period: floor(5 / 2.5) = 2
    ({**EXPONENTIAL, "warmup_steps": 0}, 0, 0.048),
    (POLYNOMIAL, 5, 4.0),
    (POLYNOMIAL, 10, 8.0),
    (POLYNOMIAL, 20, 0.08 + 7.92 * 0.25),  # halfway: (1 - 1/2)^2
    (POLYNOMIAL, 25, 0.08 + 7.92 * 0.0625),
    (POLYNOMIAL, 30, 0.08),  # end rate at total_steps
    (POLYNOMIAL, 40, 0.08),  # and held after
    ({**POLYNOMIAL, "power": 1.0}, 20, 0.08 + 7.92 * 0.5),
    (COSINE, 2, 0.5),
    (COSINE, 4, 1.0),
    (COSINE, 6, 0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2),
    (COSINE, 8, 0.55),
    (COSINE, 12, 0.1),
    (COSINE, 100, 0.1),
    # Counted from step 0, as Graphcore's schedules count: warm-up ramps to the decayed rate.
    ({**EXPONENTIAL, "decay_from_start": True}, 5, 0.048 * 0.5 * 5 / 10),  # 1 period, half-way
    ({**EXPONENTIAL, "decay_from_start": True}, 10, 0.012),  # floor(10 / 4) = 2 periods
    ({**EXPONENTIAL, "decay_from_start": True}, 14, 0.006),  # 3 (4 after warm-up's end)
    ({**COSINE, "decay_from_start": True}, 2,
     2 / 4 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 12)))),
    ({**COSINE, "decay_from_start": True}, 6, 0.1 + 0.9 * 0.5),  # cos(pi / 2): mid-way
    # A warm-up longer than the schedule (Graphcore's 2-epoch fine-tune, 5-epoch warm-up).
    ({**COSINE, "decay_from_start": True, "warmup_steps": 30, "end_learning_rate": 0.0}, 6,
     6 / 30 * 0.5),
    ({**COSINE, "decay_from_start": True, "warmup_steps": 30, "end_learning_rate": 0.0}, 12,
     0.0),
    (CONSTANT, 0, 0.01),
    (CONSTANT, 5, 0.055),
    (CONSTANT, 10, 0.1),
    (CONSTANT, 1000, 0.1),
]


@pytest.mark.parametrize("kwargs, step, expected", TABLE)
def test_golden_table(kwargs, step, expected):
    value = keras.ops.convert_to_numpy(WarmupSchedule(**kwargs)(step))
    np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-9)


def test_vectorised_steps_agree_with_table():
    # A tensor of steps, as an optimizer's iteration counter is: same values, one call.
    steps = np.array([0, 5, 10, 14, 22], "int64")
    values = keras.ops.convert_to_numpy(WarmupSchedule(**EXPONENTIAL)(steps))
    np.testing.assert_allclose(values, [0.0, 0.024, 0.048, 0.024, 0.006], rtol=1e-6)


def test_scaled_learning_rate_recipes():
    assert scaled_learning_rate(2**-14, 768) == 0.046875
    assert scaled_learning_rate(2**-9.5, 6144) == pytest.approx(8.48528137, rel=1e-8)
    with pytest.raises(ValueError, match="global_batch=0"):
        scaled_learning_rate(2**-14, 0)
    with pytest.raises(ValueError, match="base_per_sample=-1"):
        scaled_learning_rate(-1, 768)


@pytest.mark.parametrize("kwargs", [EXPONENTIAL, POLYNOMIAL, COSINE, CONSTANT,
                                    {**EXPONENTIAL, "decay_from_start": True}])
def test_config_round_trip(kwargs):
    schedule = WarmupSchedule(**kwargs, name="lr")
    config = schedule.get_config()
    assert_config_round_trip(schedule)
    revived = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert isinstance(revived, WarmupSchedule)
    assert revived.get_config() == config
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(revived(17)), keras.ops.convert_to_numpy(schedule(17))
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"base_learning_rate": 0.0}, "base_learning_rate=0.0"),
        ({"base_learning_rate": 1.0, "warmup_steps": -1}, "warmup_steps=-1"),
        ({"base_learning_rate": 1.0, "decay": "step"}, "decay='step'"),
        (
            {"base_learning_rate": 1.0, "decay": "exponential", "decay_rate": 0.9},
            "decay_steps=None",
        ),
        ({"base_learning_rate": 1.0, "decay": "exponential", "decay_steps": 5}, "decay_rate=None"),
        (
            {"base_learning_rate": 1.0, "decay": "cosine", "warmup_steps": 10, "total_steps": 10},
            "total_steps=10",
        ),
        ({"base_learning_rate": 1.0, "decay": "polynomial"}, "total_steps=None"),
        (
            {"base_learning_rate": 1.0, "decay": "cosine", "decay_from_start": True,
             "total_steps": 0},
            r"needs `total_steps` > 0. Received: total_steps=0",
        ),
        ({"base_learning_rate": 1.0, "power": 0.0}, "power=0.0"),
        ({"base_learning_rate": 1.0, "end_learning_rate": -1.0}, "end_learning_rate=-1.0"),
    ],
)
def test_invalid_arguments_raise_with_received_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WarmupSchedule(**kwargs)
