"""The architecture as data: the B0 stage table, the scaling table and the block list.

Plain Python (no Keras), so that presets and the training config can be checked before Keras and
TensorFlow load (the command line answers a mistyped flag in about a second).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from keras_efficientnet.layers.groups import num_groups


class Stage(NamedTuple):
    kernel_size: int
    repeats: int
    filters_in: int
    filters_out: int
    expand_ratio: int
    strides: int


class Scaling(NamedTuple):
    width: float
    depth: float
    resolution: int
    dropout: float


# EfficientNet-B0 (Tan & Le 2019, table 1); squeeze-excite 0.25 of each block's input channels.
B0_STAGES = (
    Stage(3, 1, 32, 16, 1, 1),
    Stage(3, 2, 16, 24, 6, 2),
    Stage(5, 2, 24, 40, 6, 2),
    Stage(3, 3, 40, 80, 6, 2),
    Stage(5, 3, 80, 112, 6, 1),
    Stage(5, 4, 112, 192, 6, 2),
    Stage(3, 1, 192, 320, 6, 1),
)
STEM_FILTERS = 32
HEAD_FILTERS = 1280
SE_RATIO = 0.25
CHANNEL_DIVISOR = 8

SCALING = {
    "b0": Scaling(1.0, 1.0, 224, 0.2),
    "b1": Scaling(1.0, 1.1, 240, 0.2),
    "b2": Scaling(1.1, 1.2, 260, 0.3),
    "b3": Scaling(1.2, 1.4, 300, 0.3),
    "b4": Scaling(1.4, 1.8, 380, 0.4),
    "b5": Scaling(1.6, 2.2, 456, 0.4),
    "b6": Scaling(1.8, 2.6, 528, 0.5),
    "b7": Scaling(2.0, 3.1, 600, 0.5),
    # Test and smoke-run variant: half width, one block per stage, seconds to build on a CPU.
    "tiny": Scaling(0.5, 0.25, 64, 0.1),
}
VARIANTS = tuple(SCALING)


def round_filters(filters: int, width: float, divisor: int = CHANNEL_DIVISOR) -> int:
    """Scales channels by `width`, rounds to a multiple of `divisor`, never below 90%."""
    scaled = filters * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * scaled:
        rounded += divisor
    return int(rounded)


def round_repeats(repeats: int, depth: float) -> int:
    """Scales a stage's block count by `depth`, rounding up."""
    return int(math.ceil(depth * repeats))


class BlockSpec(NamedTuple):
    name: str
    filters_in: int
    filters_out: int
    kernel_size: int
    strides: int
    expand_ratio: int
    group_size: int
    drop_rate: float


def block_specs(width: float, depth: float, *, group_size: int = 1, expand_ratio: int | None = None,
                first_stage_group_size: int | None = None,
                drop_connect_rate: float = 0.2) -> list[BlockSpec]:
    """The MBConv blocks of a scaled EfficientNet, named `block1a`, `block1b`, `block2a`, ...

    `expand_ratio`, when given, replaces the table's ratio in every stage whose ratio is not 1.
    Each spatial conv forms `max(channels // group_size, 1)` groups (Graphcore's rule, see
    `layers.num_groups`); a group size whose groups cannot split a block's channels evenly
    (b6's block1a: 56 channels at 16) fails here, naming the block, before any layer is built.
    `first_stage_group_size` overrides the group size of stage 1 only (e.g. 14 for b6 at G16).
    """
    repeats = [round_repeats(stage.repeats, depth) for stage in B0_STAGES]
    total, specs = sum(repeats), []
    for stage_index, (stage, count) in enumerate(zip(B0_STAGES, repeats)):
        ratio = stage.expand_ratio if expand_ratio is None or stage.expand_ratio == 1 \
            else expand_ratio
        size = group_size
        if stage_index == 0 and first_stage_group_size is not None:
            size = first_stage_group_size
        for j in range(count):
            filters_in = round_filters(stage.filters_in if j == 0 else stage.filters_out, width)
            name = f"block{stage_index + 1}{chr(ord('a') + j)}"
            try:
                num_groups(filters_in * ratio, size, where=f"{name} (spatial conv)")
            except ValueError as error:
                hint = ""
                if stage_index == 0:
                    hint = ("; stage 1 keeps the stem's channels (expand ratio 1): pass "
                            "first_stage_group_size= with one of those sizes to choose a "
                            "variant")
                raise ValueError(f"{error}{hint}") from None
            specs.append(BlockSpec(
                name=name, filters_in=filters_in,
                filters_out=round_filters(stage.filters_out, width),
                kernel_size=stage.kernel_size, strides=stage.strides if j == 0 else 1,
                expand_ratio=ratio, group_size=size,
                drop_rate=drop_connect_rate * len(specs) / total))
    return specs
