"""The one place that turns a `group_size` (channels per group) into a group count."""

from __future__ import annotations


def num_groups(channels: int, group_size: int, where: str = "convolution") -> int:
    """Returns `channels // group_size`, or a ValueError naming `where` when it does not divide.

    Args:
        channels: input channels of the convolution.
        group_size: channels per group; 1 means depthwise.
        where: the block or layer name, used in the error message.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"{where}: group_size must be a positive int, received {group_size!r}")
    if channels is None:
        raise ValueError(f"{where}: the number of input channels must be known to form groups")
    if channels % group_size:
        divisors = [d for d in range(1, channels + 1) if channels % d == 0]
        raise ValueError(
            f"{where}: group_size={group_size} does not divide its {channels} channels; "
            f"valid group sizes for this layer are {divisors}")
    return channels // group_size
