"""Named architecture presets: b0..b7 (and tiny) for G1-BN, G1-GN and the G16 families."""

from __future__ import annotations

import fnmatch

from keras_efficientnet.models.architecture import SCALING

G16_GROUP_SIZE = 16
G16_EXPAND_RATIO = 4

# G1-BN is keras.applications' EfficientNet (mean/std input normalization, so its weights
# transfer); the other families are Graphcore's, which subtract the mean only.
G16 = dict(group_size=G16_GROUP_SIZE, expand_ratio=G16_EXPAND_RATIO, input_normalization="mean")
FAMILIES = {
    "g1-bn": dict(group_size=1, norm="batch"),
    "g1-gn": dict(group_size=1, norm="group", input_normalization="mean"),
    "g16-gn": dict(**G16, norm="group"),
    "g16-lnpn": dict(**G16, norm="layer", proxy_norm=True),
    "g16-gnpn": dict(**G16, norm="group", proxy_norm=True),
    # Ablations of the normalization alone (the micro-batch benchmark trains them).
    "g16-bn": dict(**G16, norm="batch"),
    "g16-ln": dict(**G16, norm="layer"),
}


# Graphcore's rule (`layers.num_groups`) builds G16 b0-b5 and b7 as they are. b6's block1a has
# 56 channels, which max(56 // 16, 1) = 3 groups cannot split (the paper reports b0-b5 only):
# its G16 presets use 4 groups of 14 in stage 1, which keeps block1b and block1c (32 channels)
# at the rule's 2 groups of 16 and changes block1a alone.
G16_FIRST_STAGE_GROUP_SIZE = {"b6": 14}


def _build_presets() -> dict[str, dict]:
    presets = {}
    for variant in SCALING:  # "tiny" too: the smoke and default jobs use it
        for family, config in FAMILIES.items():
            config = {"variant": variant, **config}
            if config["group_size"] == G16_GROUP_SIZE and variant in G16_FIRST_STAGE_GROUP_SIZE:
                config["first_stage_group_size"] = G16_FIRST_STAGE_GROUP_SIZE[variant]
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
                             width_coefficient=None, depth_coefficient=None,
                             input_normalization="mean_std")


def preset_name(config: dict) -> str | None:
    """The preset whose architecture a model config has (resolution, classes and head aside)."""
    def architecture(values: dict) -> dict:
        return {k: values.get(k, default) for k, default in
                {"variant": None, **ARCHITECTURE_DEFAULTS}.items()}

    wanted = architecture(config)
    return next((name for name, values in PRESETS.items() if architecture(values) == wanted),
                None)


# ImageNet validation top-1 (%) of each row of Masters et al. (2021), read off the paper's
# Figure 1 (about +/-0.05 points; its per-row tables were not available), keyed by preset and
# recipe: "baseline" (G1-GN trained and tested at the native resolution, no fine-tune),
# "native" and "half" (trained at the native or about half the pixels, then the head
# fine-tuned 2 epochs at the native resolution). The flagfiles in flags/ aim at these.
_FIGURE_1 = {
    ("g1-gn", "baseline"): (76.2, 78.2, 79.2, 80.7, 82.0, 82.8),
    ("g1-gn", "native"): (79.1, 80.8, 81.4, 82.1, 82.9, 83.4),
    ("g16-gn", "native"): (79.1, 80.8, 81.5, 82.3, 83.2, 83.9),
    ("g16-gn", "half"): (77.9, 80.0, 80.8, 81.7, 82.8, 83.6),
    ("g16-lnpn", "native"): (79.4, 81.3, 81.8, 82.6, 83.4, 84.1),
    ("g16-lnpn", "half"): (78.3, 80.5, 81.2, 82.0, 83.0, 83.8),
}
PAPER_TOP1: dict[tuple[str, str], float] = {
    (f"efficientnet-{variant}-{family}", recipe): top1
    for (family, recipe), row in _FIGURE_1.items()
    for variant, top1 in zip(("b0", "b1", "b2", "b3", "b4", "b5"), row)
}
# Graphcore's application README, beside the paper: G16-GN B4 trained with LARS at batch 6144
# and 380 px, validated without a fine-tune, "~82.6%".
GRAPHCORE_TOP1: dict[tuple[str, str], float] = {("efficientnet-b4-g16-gn", "lars"): 82.6}


# keras.applications' EfficientNet (its ImageNet weights) is the G1-BN architecture with its
# input normalization, B0-B7: what those weights fit.
KERAS_APPLICATIONS_ARCHITECTURE = dict(
    group_size=1, expand_ratio=None, first_stage_group_size=None, norm="batch",
    proxy_norm=False, activation="swish", width_coefficient=None, depth_coefficient=None,
    input_normalization="mean_std")
KERAS_APPLICATIONS_VARIANTS = ("b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7")


def keras_applications_misfit(config: dict) -> str | None:
    """Why keras.applications' ImageNet weights do not fit the architecture `config`
    (EfficientNet constructor arguments, e.g. `preset_config(name)`), or None where they fit.
    Plain Python: the training command refuses `--weights=imagenet` for a G16 preset before
    TensorFlow loads."""
    differing = [f"{k}={config.get(k)!r}" for k, v in KERAS_APPLICATIONS_ARCHITECTURE.items()
                 if config.get(k, v) != v and not (k == "expand_ratio" and config.get(k) == 6)]
    variant = config.get("variant")
    if variant not in KERAS_APPLICATIONS_VARIANTS:
        differing.insert(0, f"variant={variant!r}")
    if not differing:
        return None
    fitting = (f"efficientnet-{variant}-g1-bn" if variant in KERAS_APPLICATIONS_VARIANTS else
               ", ".join(f"efficientnet-{v}-g1-bn" for v in KERAS_APPLICATIONS_VARIANTS))
    return ("keras.applications' EfficientNet weights fit only the G1-BN architecture "
            "(group_size=1, norm='batch', no proxy norm, swish, the table's expansion, width "
            "and depth, ImageNet mean/std input normalization); received "
            f"{preset_name(config) or 'this EfficientNet'} ({', '.join(differing)}). "
            f"Fitting preset: {fitting}")
