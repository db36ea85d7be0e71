"""The one place that turns a `group_size` (channels per group) into a group count."""

from __future__ import annotations


def valid_group_sizes(channels: int, limit: int | None = None) -> list[int]:
    """The group sizes up to `limit` (default `channels`) whose rule gives equal groups."""
    top = channels if limit is None else min(limit, channels)
    return [size for size in range(1, top + 1) if channels % max(channels // size, 1) == 0]


def num_groups(channels: int, group_size: int, where: str = "convolution") -> int:
    """Graphcore's rule: `max(channels // group_size, 1)` groups of `channels / groups` each.

    `group_size` is the nominal number of channels per group; where it does not divide the
    channels the groups grow (40 channels at 16: 2 groups of 20), and a layer narrower than
    `group_size` is one dense group (24 channels at 16). The groups must split the channels
    evenly (56 channels at 16 would need 3 groups of 18.67): a ValueError then names `where`,
    the channels and the group sizes that work.

    Args:
        channels: input channels of the convolution.
        group_size: nominal channels per group; 1 means depthwise.
        where: the block or layer name, used in the error message.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"{where}: group_size must be a positive int, received {group_size!r}")
    if channels is None:
        raise ValueError(f"{where}: the number of input channels must be known to form groups")
    groups = max(channels // group_size, 1)
    if channels % groups:
        valid = valid_group_sizes(channels, limit=2 * group_size)
        raise ValueError(
            f"{where}: group_size={group_size} gives max({channels} // {group_size}, 1) = "
            f"{groups} groups, which do not split its {channels} channels evenly; group sizes "
            f"that do (up to {2 * group_size}): {valid}")
    return groups
