"""keras.applications' EfficientNet B0-B7 ImageNet weights, loaded into the G1-BN presets."""

from __future__ import annotations

import logging
import os
import re

import keras
import numpy as np

from keras_efficientnet.layers.image_normalization import IMAGENET_MEAN, IMAGENET_STD
from keras_efficientnet.models.architecture import SCALING, block_specs, round_filters
from keras_efficientnet.models.presets import (
    KERAS_APPLICATIONS_VARIANTS,
    keras_applications_misfit,
)

log = logging.getLogger("keras_efficientnet")

# Where keras.applications keeps its EfficientNet files, and their md5 sums (with the classifier,
# without it), as `keras.applications.EfficientNetB0..B7` download them.
WEIGHTS_URL = "https://storage.googleapis.com/keras-applications/"
WEIGHTS_HASHES = {
    "b0": ("902e53a9f72be733fc0bcb005b3ebbac", "50bc09e76180e00e4465e1a485ddc09d"),
    "b1": ("1d254153d4ab51201f1646940f018540", "74c4e6b3e1f6a1eea24c589628592432"),
    "b2": ("b15cce36ff4dcbd00b6dd88e7857a6ad", "111f8e2ac8aa800a7a99e3239f7bfb39"),
    "b3": ("ffd1fdc53d0ce67064dc6a9c7960ede0", "af6d107764bb5b1abb91932881670226"),
    "b4": ("18c95ad55216b8f92d7e70b3a046e2fc", "ebc24e6d6c33eaebbd558eafbeedf1ba"),
    "b5": ("ace28f2a6363774853a83a0b21b9421a", "38879255a25d3c92d5e44e04ae6cec6f"),
    "b6": ("165f6e37dce68623721b423839de8be5", "9ecce42647a20130c1f39a5d4cb75743"),
    "b7": ("8c03f828fec3ef71311cd463b6759d99", "cbcfe4450ddf6f3ad90b1b398090fe4a"),
}
IMAGENET_CLASSES = 1000

# Our layer (a variable path without its last component) -> keras.applications' layer name.
# Everything outside the MBConv blocks:
_TOP_LEVEL = {"stem_conv": "stem_conv", "stem_norm": "stem_bn", "head_conv": "top_conv",
              "head_norm": "top_bn", "predictions": "predictions"}
# Inside block `name` (keras.applications flattens it to `{name}_{suffix}`):
_IN_BLOCK = {"expand_conv": "expand_conv", "expand_norm": "expand_bn", "spatial_conv": "dwconv",
             "spatial_norm": "bn", "se/reduce": "se_reduce", "se/expand": "se_expand",
             "project_conv": "project_conv", "project_norm": "project_bn"}
# keras.applications' depthwise kernel is (kh, kw, channels, 1); GroupConv2D's with one channel
# per group is (kh, kw, 1, channels). Every other weight has the same layout in both.
_DEPTHWISE = "dwconv"
def check_weights(weights, config: dict) -> None:
    """Raises a ValueError unless `weights` is "imagenet" or an existing `.h5` file and the
    architecture in `config` (EfficientNet constructor arguments) is the one they fit.

    Called before the model is built, so that a misfit fails at once.
    """
    if isinstance(weights, os.PathLike):
        weights = os.fspath(weights)
    if not isinstance(weights, str) or not weights:
        raise ValueError(f"weights must be None, 'imagenet' or the path of a keras.applications "
                         f"EfficientNet .h5 file, received {weights!r}")
    if weights != "imagenet":
        if not weights.endswith((".h5", ".hdf5")):
            raise ValueError(f"weights={weights!r} is neither 'imagenet' nor a .h5 file; pass "
                             "None, 'imagenet' or the path of a keras.applications EfficientNet "
                             ".h5 file")
        if not os.path.isfile(weights):
            raise ValueError(f"weights={weights!r}: no such file")
    misfit = keras_applications_misfit(config)
    if misfit:
        raise ValueError(f"weights={weights!r} are keras.applications' EfficientNet weights; "
                         f"{misfit}")


class WeightsDownloadError(ConnectionError):
    """keras.applications' weights file is not in Keras' cache and could not be fetched."""


def keras_cache_dir() -> str:
    """The cache `keras.utils.get_file` uses by default, by Keras' own rule ($KERAS_HOME, else
    ~/.keras; /tmp/.keras where that cannot be written), written out because Keras has no public
    accessor for it; `weights_file` passes it to `get_file`, so the two always agree."""
    home = os.path.expanduser("~")
    base = os.path.expanduser(os.environ.get("KERAS_HOME") or os.path.join(
        home if os.access(home, os.W_OK) else "/tmp", ".keras"))
    return base if os.access(base, os.W_OK) else os.path.join("/tmp", ".keras")


def weights_file(variant: str, with_top: bool) -> str:
    """keras.applications' file for `variant`, through Keras' download cache (fetched once);
    WeightsDownloadError, one line saying where to put the file, when it cannot be fetched."""
    name = f"efficientnet{variant}{'' if with_top else '_notop'}.h5"
    cache = keras_cache_dir()
    try:
        return keras.utils.get_file(name, WEIGHTS_URL + name, cache_dir=cache,
                                    cache_subdir="models",
                                    file_hash=WEIGHTS_HASHES[variant][0 if with_top else 1])
    except Exception as error:
        # Keras reports a failed fetch as a bare Exception ("URL fetch failure on ...: ...");
        # anything more specific (a hash mismatch is a ValueError) is not about the network.
        if type(error) is not Exception and not isinstance(error, OSError):
            raise
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(
            error).__name__
        raise WeightsDownloadError(
            f"could not download keras.applications' ImageNet weights {name} ({reason}); "
            f"offline, put that file at {os.path.join(cache, 'models', name)} (from "
            f"{WEIGHTS_URL}{name}), "
            f"or pass its path instead of 'imagenet'") from None


def _attribute(group, name: str) -> list[str]:
    # Keras' HDF5 writer splits attributes larger than HDF5's 64 KiB limit into name0, name1, ...
    if name in group.attrs:
        values = list(group.attrs[name])
    else:
        values, chunk = [], 0
        while f"{name}{chunk}" in group.attrs:
            values += list(group.attrs[f"{name}{chunk}"])
            chunk += 1
    return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in values]


def _weight_name(name: str) -> str:
    # "block1a_dwconv/depthwise_kernel:0" -> "kernel"; "stem_bn/moving_mean:0" -> "moving_mean".
    short = re.sub(r":\d+$", "", name).rsplit("/", 1)[-1]
    return "kernel" if short == "depthwise_kernel" else short


def read_keras_h5(path: str) -> dict[str, dict[str, np.ndarray]]:
    """The weights of a Keras HDF5 weights file: `{layer name: {weight name: array}}`.

    Reads the layout of `keras.applications`' files (and of any Keras `.h5` weights or model
    file): the root (or its `model_weights` group) lists `layer_names`; each layer's group lists
    its `weight_names`, which name its datasets.
    """
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise ValueError(f"weights={path!r} is not an HDF5 file ({error})") from None
    with handle as f:
        root = f["model_weights"] if "model_weights" in f and "layer_names" not in f.attrs else f
        if not _attribute(root, "layer_names"):
            raise ValueError(f"weights={path!r} is not a Keras weights file: it lists no "
                             "layer_names")
        layers = {}
        for layer in _attribute(root, "layer_names"):
            names = _attribute(root[layer], "weight_names")
            if names:
                layers[layer] = {_weight_name(n): np.asarray(root[layer][n]) for n in names}
        return layers


def _file_variant(layers: dict) -> str | None:
    """The keras.applications variant whose blocks and stem a file holds, if any."""
    blocks = {name.split("_")[0] for name in layers if re.match(r"block\d+[a-z]_", name)}
    stem = layers.get("stem_conv", {}).get("kernel")
    for variant in KERAS_APPLICATIONS_VARIANTS:
        scaling = SCALING[variant]
        names = {spec.name for spec in block_specs(scaling.width, scaling.depth)}
        if names == blocks and stem is not None and stem.shape[-1] == round_filters(
                32, scaling.width):
            return variant
    return None


def _source_layer(path: str, block_names: set[str]) -> str | None:
    owner = path.rsplit("/", 1)[0]
    if owner in _TOP_LEVEL:
        return _TOP_LEVEL[owner]
    block, _, inner = owner.partition("/")
    if block in block_names and inner in _IN_BLOCK:
        return f"{block}_{_IN_BLOCK[inner]}"
    return None


def _check_input_normalization(model: keras.Model) -> None:
    layer = model.get_layer("normalize")
    if not (np.allclose(layer.mean, IMAGENET_MEAN, rtol=1e-6)
            and np.allclose(layer.std, IMAGENET_STD, rtol=1e-6)):
        raise ValueError(
            f"keras.applications' weights expect images normalized with ImageNet's mean and "
            f"std ({tuple(round(m, 3) for m in IMAGENET_MEAN)}, "
            f"{tuple(round(s, 3) for s in IMAGENET_STD)} in pixel units); {model.name} "
            f"normalizes with mean={layer.mean}, std={layer.std}")


def _match_variables(model: keras.Model, layers: dict, head_fits: bool):
    """(variable, value) pairs of `model` from the file's `layers`, the misfits (as text) and
    the variables with no keras.applications counterpart."""
    blocks = set(model.block_names)
    assignments, misfits, unmapped, used = [], [], [], set()
    for variable in model.weights:
        layer_name = _source_layer(variable.path, blocks)
        if layer_name is None:
            unmapped.append(variable.path)
            continue
        if layer_name == "predictions" and not head_fits:
            continue  # a new classifier: logged by load_weights
        used.add(layer_name)
        value = layers.get(layer_name, {}).get(variable.path.rsplit("/", 1)[-1])
        if value is not None and layer_name.endswith(_DEPTHWISE):
            value = np.transpose(value, (0, 1, 3, 2))
        if value is None or value.shape != tuple(variable.shape):
            misfits.append(f"{variable.path} {tuple(variable.shape)} <- {layer_name} "
                           f"{None if value is None else value.shape}")
            continue
        assignments.append((variable, value))
    # Layers of the file that nothing here takes (a deeper variant's extra blocks), apart from
    # keras.applications' input normalization and an unused classifier.
    misfits += [f"{name} (not in this model)" for name in layers
                if name not in used and name != "predictions"
                and not name.startswith("normalization")]
    return assignments, misfits, unmapped


def load_weights(model: keras.Model, weights: str) -> None:
    """Loads keras.applications' EfficientNet weights into a G1-BN `model`.

    `weights` is "imagenet" (the variant's file through Keras' download cache: with the
    classifier when the model has 1000 classes, without it otherwise) or the path of such a file.
    Layers are matched by name (`block2a/spatial_conv` <- `block2a_dwconv`, ...), the depthwise
    kernels transposed to GroupConv2D's layout, and every shape is checked before anything is
    assigned. The classifier loads when the model has one of the file's size; otherwise it stays
    newly initialized (the transfer-learning case) and a log line says so. keras.applications'
    own input normalization (a Rescaling and a Normalization layer) is not read: the model's
    `normalize` layer computes the same ImageNet mean/std normalization.
    """
    config = model.get_config()
    check_weights(weights, config)
    _check_input_normalization(model)
    variant = config["variant"]
    if weights == "imagenet":
        with_top = config["include_top"] and config["classes"] == IMAGENET_CLASSES
        source = weights_file(variant, with_top)
    else:
        source = os.fspath(weights)
    layers = read_keras_h5(source)
    file_head = layers.get("predictions", {})
    head_fits = bool(file_head) and all(
        file_head.get(v.path.rsplit("/", 1)[-1], np.empty(0)).shape == tuple(v.shape)
        for v in model.weights if v.path.startswith("predictions/"))
    assignments, misfits, unmapped = _match_variables(model, layers, head_fits)
    if unmapped:
        raise ValueError(f"{model.name}: no keras.applications counterpart for {unmapped[:3]}")
    if misfits:
        held = _file_variant(layers)
        what = (f"the file holds keras.applications' EfficientNet{held.upper()}, which fits "
                f"efficientnet-{held}-g1-bn" if held else
                "the file is not a keras.applications EfficientNet B0-B7 weights file; "
                "fitting presets: " + ", ".join(
                    f"efficientnet-{v}-g1-bn" for v in KERAS_APPLICATIONS_VARIANTS))
        raise ValueError(
            f"weights {source!r} do not fit efficientnet-{variant}-g1-bn ({len(misfits)} of "
            f"{len(model.weights)} variables, e.g. {'; '.join(misfits[:2])}); {what}")
    for variable, value in assignments:
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))
    if config["include_top"] and not head_fits:
        file_classes = file_head["kernel"].shape[-1] if "kernel" in file_head else None
        log.info("loaded %s into %s; its %d-class classifier is newly initialized (%s)",
                 source, model.name, config["classes"],
                 f"the file's has {file_classes} classes" if file_classes
                 else "the file has no classifier")
    else:
        log.info("loaded %s into %s", source, model.name)
