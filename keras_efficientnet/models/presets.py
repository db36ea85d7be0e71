"""Named architecture presets: b0..b7 (and tiny) for G1-BN, G1-GN, G16-GN, G16-GN+PN, G16-LN+PN."""

from __future__ import annotations

import fnmatch

from keras_efficientnet.models.architecture import SCALING, block_specs

G16_GROUP_SIZE = 16
G16_EXPAND_RATIO = 4

FAMILIES = {
    "g1-bn": dict(group_size=1, norm="batch"),
    "g1-gn": dict(group_size=1, norm="group"),
    "g16-gn": dict(group_size=G16_GROUP_SIZE, expand_ratio=G16_EXPAND_RATIO, norm="group"),
    "g16-lnpn": dict(group_size=G16_GROUP_SIZE, expand_ratio=G16_EXPAND_RATIO, norm="layer",
                     proxy_norm=True),
    "g16-gnpn": dict(group_size=G16_GROUP_SIZE, expand_ratio=G16_EXPAND_RATIO, norm="group",
                     proxy_norm=True),
}


def _first_stage_group_size(variant: str, group_size: int) -> int | None:
    # Stage 1 keeps expand ratio 1, so its blocks see the stem's and stage 1's own channels
    # (b4: 48 and 24), which 16 need not divide: there, use the largest group size not above
    # `group_size` that divides them all. Every other stage's channels are multiples of 32.
    scaling = SCALING[variant]
    channels = [spec.filters_in for spec in block_specs(scaling.width, scaling.depth)
                if spec.name.startswith("block1")]
    if all(c % group_size == 0 for c in channels):
        return None
    return max(d for d in range(1, group_size + 1) if all(c % d == 0 for c in channels))


def _build_presets() -> dict[str, dict]:
    presets = {}
    for variant in SCALING:  # "tiny" too: the smoke and default jobs use it
        for family, config in FAMILIES.items():
            config = {"variant": variant, **config}
            first = _first_stage_group_size(variant, config["group_size"])
            if first is not None:
                config["first_stage_group_size"] = first
            presets[f"efficientnet-{variant}-{family}"] = config
    return presets


PRESETS = _build_presets()


def preset_config(preset: str) -> dict:
    """Returns the constructor arguments of a named preset (a copy)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {sorted(PRESETS)}")
    return dict(PRESETS[preset])


def list_presets(pattern: str | None = None) -> list[str]:
    """Sorted preset names, those matching a shell-style `pattern` when one is given.

    Example:
        >>> list_presets("*-b0-*")
        ['efficientnet-b0-g1-bn', 'efficientnet-b0-g1-gn', 'efficientnet-b0-g16-gn',
         'efficientnet-b0-g16-gnpn', 'efficientnet-b0-g16-lnpn']
    """
    names = sorted(PRESETS)
    return names if pattern is None else [n for n in names if fnmatch.fnmatchcase(n, pattern)]


# The architecture arguments a preset may set, with the constructor's defaults.
ARCHITECTURE_DEFAULTS = dict(group_size=1, expand_ratio=None, first_stage_group_size=None,
                             norm="batch", norm_groups=4, proxy_norm=False, activation="swish",
                             width_coefficient=None, depth_coefficient=None)


def preset_name(config: dict) -> str | None:
    """The preset whose architecture a model config has (resolution, classes and head aside)."""
    def architecture(values: dict) -> dict:
        return {k: values.get(k, default) for k, default in
                {"variant": None, **ARCHITECTURE_DEFAULTS}.items()}

    wanted = architecture(config)
    return next((name for name, values in PRESETS.items() if architecture(values) == wanted),
                None)
