"""EfficientNet B0..B7 from one stage table and one scaling table, with G16 and Proxy Norm."""

from __future__ import annotations

import difflib
import inspect
import math
import os
import warnings

import keras
import numpy as np

from keras_efficientnet.layers.group_conv import conv_kernel_initializer
from keras_efficientnet.layers.image_normalization import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageNormalization,
    check_image_dtype,
    check_input_dtype,
)
from keras_efficientnet.layers.mbconv import MBConvBlock, norm_activation
from keras_efficientnet.layers.normalization import check_norm
from keras_efficientnet.models.architecture import (  # noqa: F401 - re-exported
    B0_STAGES,
    CHANNEL_DIVISOR,
    HEAD_FILTERS,
    SCALING,
    SE_RATIO,
    STEM_FILTERS,
    VARIANTS,
    BlockSpec,
    Scaling,
    Stage,
    block_specs,
    round_filters,
    round_repeats,
)

POOLINGS = (None, "avg", "max")
# Keyword arguments that keras.Model itself takes from a saved config, besides `name`.
MODEL_KWARGS = ("trainable",)
# (mean, std) in pixel units. "mean_std": keras.applications' (so G1-BN weights transfer);
# "mean": Graphcore's EfficientNet, which subtracts the ImageNet mean and does not divide.
INPUT_NORMALIZATIONS = {
    "mean_std": (IMAGENET_MEAN, IMAGENET_STD),
    "mean": ((123.68, 116.78, 103.94), (1.0, 1.0, 1.0)),
}


def _check_input_shape(input_shape) -> tuple:
    valid = "(height, width, 3) with height, width ints >= 32 or None"
    if not isinstance(input_shape, (tuple, list)) or len(input_shape) != 3:
        raise ValueError(f"input_shape must be {valid}, received {input_shape!r}")
    height, width, channels = input_shape
    for size in (height, width):
        if size is not None and (not isinstance(size, int) or size < 32):
            raise ValueError(f"input_shape must be {valid}, received {input_shape!r}")
    if channels != 3:
        raise ValueError(f"input_shape must be {valid} (RGB), received {input_shape!r}")
    return tuple(input_shape)


def _check_arguments(variant: str, *, norm, norm_groups, proxy_norm, pooling, include_top,
                     classes, input_normalization, expand_ratio, input_dtype) -> None:
    """The constructor's checks of its arguments, each a one-line ValueError."""
    if variant not in SCALING:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, received {variant!r}")
    check_norm(norm, norm_groups, proxy_norm)
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {list(POOLINGS)}, received {pooling!r}")
    if include_top and (not isinstance(classes, int) or classes < 1):
        raise ValueError(f"classes must be a positive int, received {classes!r}")
    if input_normalization not in INPUT_NORMALIZATIONS:
        raise ValueError(f"input_normalization must be one of {list(INPUT_NORMALIZATIONS)}, "
                         f"received {input_normalization!r}")
    if expand_ratio is not None and (not isinstance(expand_ratio, int) or expand_ratio < 1):
        raise ValueError(f"expand_ratio must be a positive int or None, received "
                         f"{expand_ratio!r}")
    check_input_dtype(input_dtype)


def _network(inputs, specs, width: float, config: dict, dropout: float):
    """The functional graph from `inputs`: normalization, stem, the MBConv blocks of `specs`,
    head, and the classifier or pooling the `config` (the constructor's arguments) asks for."""
    norm = {key: config[key] for key in ("norm", "norm_groups", "proxy_norm", "activation")}

    def norm_act(x, channels, prefix, proxy_scale=True):
        for layer in norm_activation(norm["norm"], channels, norm_groups=norm["norm_groups"],
                                     proxy_norm=norm["proxy_norm"],
                                     activation=norm["activation"], prefix=prefix,
                                     where=prefix, proxy_scale=proxy_scale):
            x = layer(x)
        return x

    mean, std = INPUT_NORMALIZATIONS[config["input_normalization"]]
    x = ImageNormalization(mean, std, name="normalize")(inputs)
    stem_filters = round_filters(STEM_FILTERS, width)
    x = keras.layers.Conv2D(stem_filters, 3, strides=2, padding="same", use_bias=False,
                            kernel_initializer=conv_kernel_initializer(), name="stem_conv")(x)
    x = norm_act(x, stem_filters, "stem")
    for spec in specs:
        x = MBConvBlock(spec.filters_in, spec.filters_out, spec.kernel_size, spec.strides,
                        expand_ratio=spec.expand_ratio, se_ratio=SE_RATIO,
                        group_size=spec.group_size, drop_rate=spec.drop_rate, name=spec.name,
                        **norm)(x)
    head_filters = round_filters(HEAD_FILTERS, width)
    x = keras.layers.Conv2D(head_filters, 1, use_bias=False,
                            kernel_initializer=conv_kernel_initializer(), name="head_conv")(x)
    # As in Graphcore's implementation, the head's proxy 1 / sigma is dropped: pooling and
    # the classifier follow, and the classifier's weights absorb a per-channel scale.
    x = norm_act(x, head_filters, "head", proxy_scale=False)
    return _top(x, config, dropout)


def _top(x, config: dict, dropout: float):
    """The classifier (include_top) or the pooling that ends the network."""
    if config["include_top"]:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        if dropout > 0:
            x = keras.layers.Dropout(dropout, name="top_dropout")(x)
        # The classifier computes in float32 under mixed precision, so the loss, softmax and
        # top-k metrics see full-precision logits.
        return keras.layers.Dense(
            config["classes"], activation=config["classifier_activation"], name="predictions",
            dtype="float32", kernel_initializer=keras.initializers.VarianceScaling(
                1.0 / 3.0, mode="fan_out", distribution="uniform"))(x)
    if config["pooling"] == "avg":
        return keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    if config["pooling"] == "max":
        return keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    return x


def _check_keyword_arguments(kwargs: dict) -> None:
    # Like keras.applications: a misspelt argument (`num_classes=` for `classes=`) must not
    # silently build another model.
    unknown = sorted(set(kwargs) - set(MODEL_KWARGS))
    if not unknown:
        return
    valid = [name for name, parameter in inspect.signature(EfficientNet.__init__).parameters.items()
             if name != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD]
    valid += list(MODEL_KWARGS)
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        if not close:
            close = [v for v in valid if v in name or name in v][:1]
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(f"EfficientNet() got unexpected keyword argument(s) {', '.join(hints)}; "
                    f"valid arguments: {valid}")


def looks_unit_range(images) -> bool:
    """Whether `images` is a non-empty float NumPy array with every value in [0, 1]."""
    return (isinstance(images, np.ndarray) and images.dtype.kind == "f" and images.size > 0
            and 0.0 <= float(images.min()) and float(images.max()) <= 1.0)


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class EfficientNet(keras.Model):
    """EfficientNet B0..B7 (Tan & Le 2019) with the changes of Masters et al. 2021.

    A functional Keras model whose input is RGB pixel values in [0, 255], normalized inside the
    model. By default (`input_dtype="float32"`) it takes uint8 or float pixels, as
    keras.applications does, so `keras.utils.image_dataset_from_directory` and Keras'
    augmentation layers feed it unchanged; uint8 batches (the host pipeline's, a quarter of the
    bytes) are cast inside the model. Float images in [0, 1] must be multiplied by 255: `predict`
    and eager calls on NumPy arrays warn once when every value is in [0, 1].
    `input_dtype="uint8"` takes only integers and refuses float input with a message rather
    than truncating it. `group_size=16, expand_ratio=4` gives the paper's G16 variant, and
    `norm="layer"` or `"group"` with `proxy_norm=True` its batch-independent normalization.
    Unknown keyword arguments raise a `TypeError`, as in `keras.applications`.

    Args:
        variant: "b0".."b7", or "tiny" (half-width, one block per stage) for tests. Default "b0".
        group_size: channels per group of every block's spatial conv (1 = depthwise). Default 1.
        expand_ratio: replaces the table's expansion (6) in stages 2-7; None keeps it.
        first_stage_group_size: group size of stage 1 only; None = `group_size`. Not needed
            for b0-b5 (Graphcore's rule forms 2 groups of 20 from b3's 40 channels, 3 of 16
            from b4's and b5's 48); b6 at 16 (56 channels, 3 groups) fails unless it is given.
        norm: "batch", "group" or "layer". Default "batch".
        norm_groups: groups of the group norm. Default 4.
        proxy_norm: Proxy Norm activations at the stem, expand, spatial conv and head; the
            spatial conv's 1 / sigma goes into the squeeze-excite gate and the head's is dropped,
            as in Graphcore's implementation (docs/graphcore-fidelity.md).
        activation: activation name. Default "swish".
        include_top: add pooling, dropout and the classifier. Default True.
        pooling: None, "avg" or "max" for the headless model's output. Default None.
        classes: classifier outputs. Default 1000.
        classifier_activation: activation of the classifier. Default "softmax".
        dropout_rate: before the classifier; None takes the variant's. Default None.
        drop_connect_rate: stochastic depth of the last block (linear in block index). Default 0.2.
        input_shape: (height, width, 3); None takes the variant's resolution. Use
            (None, None, 3) to accept any resolution.
        input_dtype: dtype of the input tensor: "float32" (default: uint8 or float pixels in
            [0, 255]), another float dtype, or "uint8" (integers only).
        input_normalization: "mean_std" subtracts ImageNet's mean and divides by its standard
            deviation (keras.applications); "mean" only subtracts the mean (Graphcore's
            recipe, which the G16 and G1-GN presets follow). Default "mean_std".
        width_coefficient, depth_coefficient: override the variant's scaling.
        weights: None (random initialization), "imagenet" (keras.applications' EfficientNet
            B0-B7 ImageNet weights, fetched once through Keras' download cache) or the path of
            such a `.h5` file. Only the G1-BN architecture (`efficientnet-bN-g1-bn`) fits them;
            with `include_top=False` or `classes != 1000` the backbone loads and the classifier
            stays newly initialized. Not part of `get_config()`: a saved model carries its own
            weights. See docs/pretrained.md.

    Example:
        >>> model = EfficientNet("b0", group_size=16, expand_ratio=4, norm="layer",
        ...                      proxy_norm=True, input_shape=(224, 224, 3))
        >>> model.block_names[:3]
        ('block1a', 'block2a', 'block2b')
    """

    def __init__(self, variant: str = "b0", *, group_size: int = 1,
                 expand_ratio: int | None = None, first_stage_group_size: int | None = None,
                 norm: str = "batch", norm_groups: int = 4, proxy_norm: bool = False,
                 activation: str = "swish", include_top: bool = True, pooling: str | None = None,
                 classes: int = 1000, classifier_activation="softmax",
                 dropout_rate: float | None = None, drop_connect_rate: float = 0.2,
                 input_shape=None, input_dtype: str = "float32",
                 input_normalization: str = "mean_std",
                 width_coefficient: float | None = None, depth_coefficient: float | None = None,
                 weights: str | None = None, name: str | None = None, **kwargs):
        _check_keyword_arguments(kwargs)
        _check_arguments(variant, norm=norm, norm_groups=norm_groups, proxy_norm=proxy_norm,
                         pooling=pooling, include_top=include_top, classes=classes,
                         input_normalization=input_normalization, expand_ratio=expand_ratio,
                         input_dtype=input_dtype)
        scaling = SCALING[variant]
        width = scaling.width if width_coefficient is None else float(width_coefficient)
        depth = scaling.depth if depth_coefficient is None else float(depth_coefficient)
        shape = _check_input_shape(
            (scaling.resolution, scaling.resolution, 3) if input_shape is None else input_shape)
        config = dict(
            variant=variant, group_size=group_size, expand_ratio=expand_ratio,
            first_stage_group_size=first_stage_group_size, norm=norm, norm_groups=norm_groups,
            proxy_norm=proxy_norm, activation=activation, include_top=include_top,
            pooling=pooling, classes=classes, classifier_activation=classifier_activation,
            dropout_rate=dropout_rate, drop_connect_rate=drop_connect_rate,
            input_shape=list(input_shape) if input_shape is not None else None,
            input_dtype=input_dtype, input_normalization=input_normalization,
            width_coefficient=width_coefficient, depth_coefficient=depth_coefficient)
        if weights is not None:  # before building: a misfit fails at once, even for B7
            from keras_efficientnet.models import pretrained

            pretrained.check_weights(weights, config)
        specs = block_specs(width, depth, group_size=group_size, expand_ratio=expand_ratio,
                            first_stage_group_size=first_stage_group_size,
                            drop_connect_rate=drop_connect_rate)
        inputs = keras.Input(shape, dtype=input_dtype, name="images")
        outputs = _network(inputs, specs, width, config,
                           scaling.dropout if dropout_rate is None else float(dropout_rate))
        super().__init__(inputs=inputs, outputs=outputs, name=name or f"efficientnet_{variant}",
                         **kwargs)
        self._config = config
        self.block_names = tuple(spec.name for spec in specs)
        if weights is not None:
            from keras_efficientnet.models import pretrained

            pretrained.load_weights(self, weights)

    def _check_images(self, inputs) -> None:
        # A uint8 input would silently truncate float images (in [0, 1]: to near-black).
        images = inputs.get("images") if isinstance(inputs, dict) else inputs
        if isinstance(images, (list, tuple)) and len(images) == 1:
            images = images[0]
        check_image_dtype(images, self._config["input_dtype"], self.name)

    def __call__(self, *args, **kwargs):
        if args:  # checked here too, so the error comes out without Keras' call report
            self._check_images(args[0])
            self._warn_unit_range(args[0])
        return super().__call__(*args, **kwargs)

    # ------------------------------------------------------------------ fused inference

    @property
    def fused_inference(self) -> str:
        """Which computation inference runs (`model(x, training=False)`, `predict`,
        `predict_on_batch`, `evaluate`): "auto" (default; the layers' fused forms where they
        are faster: LayerNorm/GroupNorm models computing in float32 on TensorFlow without XLA,
        i.e. `jit_compile` off, the default on a CPU), "on" (always; a ValueError for a model
        that does not compute in float32) or "off" (Keras' layers one by one). Training never
        fuses. Not saved with the model. Inside another model compiled with
        `jit_compile=True` on a CPU, set it to "off" (or compile this model with XLA too):
        XLA has no kernel for the fused statistics' `EuclideanNorm`."""
        return self.__dict__.get("_fused_inference", "auto")

    @fused_inference.setter
    def fused_inference(self, value: str) -> None:
        self.fuses(value)  # checks the value before anything changes
        # Kept out of Keras' attribute tracking: a setting, not state.
        self.__dict__["_fused_inference"] = value
        # Keras traces `predict_function` and `test_function` once: trace them again.
        self.predict_function = None
        self.test_function = None

    def fuses(self, setting: str | None = None) -> bool:
        """Whether inference under `setting` (default: `fused_inference`) is the fused pass."""
        from keras_efficientnet.layers.fusion import check_choice

        setting = check_choice(self.fused_inference if setting is None else setting)
        if setting == "off":
            return False
        compute_dtype = keras.dtype_policies.get(self.dtype_policy).compute_dtype
        if setting == "on" and compute_dtype != "float32":
            raise ValueError(
                f"fused inference: {self.name} computes in {compute_dtype}; fuse a float32 copy "
                "(keras_efficientnet.training.export.inference_model(model))")
        # "auto": where the norms are most of the time and nothing fuses them already
        # (BatchNorm folds into the convs; XLA, on with `jit_compile`, fuses element-wise ops).
        return setting == "on" or (
            keras.backend.backend() == "tensorflow" and compute_dtype == "float32"
            and self._config["norm"] != "batch" and not self.jit_compile)

    def fused_call(self, inputs, portable: bool = False):
        """The inference forward pass with each layer in its fused form (`layers/fusion.py`):
        the same outputs as Keras' layers to float32 round-off, with fewer passes over memory.
        `portable`: only ops that TFLite and ONNX converters take."""
        from keras_efficientnet.layers.fusion import fused_sequence, materialize

        self._check_images(inputs)
        images = inputs.get("images") if isinstance(inputs, dict) else inputs
        if isinstance(images, (list, tuple)) and len(images) == 1:
            images = images[0]
        # An EfficientNet is a chain by construction (`_network`): each layer takes the one
        # before's output, in `self.layers`' order.
        chain = [layer for layer in self.layers
                 if not isinstance(layer, keras.layers.InputLayer)]
        return materialize(*fused_sequence(chain, images, portable=portable))

    def predict(self, x, *args, serving: str | None = None, **kwargs):
        """Keras' `predict`, running what `fused_inference` chooses (as `predict_on_batch` and
        `model(x, training=False)` do). `serving` ("auto", "on", "off") is deprecated: set
        `model.fused_inference` instead."""
        self._warn_unit_range(x)
        if serving is None:
            return super().predict(x, *args, **kwargs)
        warnings.warn("EfficientNet.predict(serving=...) is deprecated: set "
                      f"model.fused_inference = {serving!r} (predict, predict_on_batch and "
                      "calls then agree)", DeprecationWarning, stacklevel=2)
        if self.fuses(serving) == self.fuses():
            return super().predict(x, *args, **kwargs)
        previous = self.fused_inference  # for this call only (traced again, both ways)
        self.fused_inference = serving
        try:
            return super().predict(x, *args, **kwargs)
        finally:
            self.fused_inference = previous

    def _warn_unit_range(self, images) -> None:
        # Only host NumPy arrays, where the check is cheap (a device tensor would have to be
        # copied back, a graph tensor has no values); once per model.
        if getattr(self, "_unit_range_warned", False) or not looks_unit_range(images):
            return
        self._unit_range_warned = True
        warnings.warn(
            f"{self.name} takes pixel values in [0, 255], but every value of these float "
            "images is in [0, 1]: multiply them by 255 (keras.applications' convention), or "
            "the predictions are those of a near-black image", stacklevel=3)

    def call(self, inputs, training=None, mask=None, fused: bool | None = None, **kwargs):
        """Keras' layers, or at inference (`training` not true) the fused pass where
        `fused_inference` chooses it; `fused=True` or `False` decides for this call."""
        self._check_images(inputs)  # stateless calls (JAX training) come straight here
        if not training and (self.fuses() if fused is None else fused):
            # XLA has no EuclideanNorm: under `jit_compile` the portable statistics.
            return self.fused_call(inputs, portable=bool(self.jit_compile))
        return super().call(inputs, training=training, mask=mask, **kwargs)

    # Boundaries: "stem" and "head" plus one entry per MBConv block, in forward order.
    def block_layers(self) -> dict[str, list[keras.Layer]]:
        """Maps "stem", each block name and "head" to the layers that make it up, in order."""
        groups: dict[str, list[keras.Layer]] = {"stem": []}
        current = "stem"
        for layer in self.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            if layer.name in self.block_names:
                current = layer.name
            elif layer.name == "head_conv":
                current = "head"
            groups.setdefault(current, []).append(layer)
        return groups

    def feature_maps(self, strides=(4, 8, 16, 32)) -> keras.Model:
        """A model from the same images to the backbone's feature maps, by name, for detection
        and segmentation heads.

        Each output is the last MBConv block's output at one stride (stride 32: the last block
        before the head conv, as timm's `features_only` and keras-hub's pyramid outputs pick
        them), named `"P2"` (stride 4), `"P3"` (8), `"P4"` (16) and `"P5"` (32): pyramid level
        `k` has stride `2**k`. The returned model shares this model's layers and weights, so
        training it trains the backbone; build the backbone with `include_top=False` to leave
        the classifier out, and with `input_shape=(None, None, 3)` to take any resolution.

        Args:
            strides: the strides wanted, each a power of two from 2 to 32. Default (4, 8, 16, 32).

        Example:
            >>> backbone = EfficientNet("b0", include_top=False, input_shape=(None, None, 3))
            >>> features = backbone.feature_maps()
            >>> {k: v.shape for k, v in features(np.zeros((1, 224, 224, 3), "uint8")).items()}
            {'P2': (1, 56, 56, 24), 'P3': (1, 28, 28, 40), 'P4': (1, 14, 14, 112),
             'P5': (1, 7, 7, 320)}
        """
        last_at_stride, stride = {}, 2  # the stem conv has stride 2
        for block_name in self.block_names:
            block = self.get_layer(block_name)
            stride *= block.strides
            last_at_stride[stride] = block
        wanted = tuple(strides)
        missing = [s for s in wanted if s not in last_at_stride]
        if not wanted or missing:
            raise ValueError(f"{self.name}: feature maps exist at strides "
                             f"{sorted(last_at_stride)}, received strides={strides!r}")
        outputs = {f"P{int(math.log2(s))}": last_at_stride[s].output for s in wanted}
        return keras.Model(self.input, outputs, name=f"{self.name}_features")

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> EfficientNet:
        """Builds a named architecture, e.g. "efficientnet-b4-g16-lnpn"; see `list_presets()`;
        or a run directory of this project `RUN[:final|best|average|latest]` (default final):
        its architecture, classes and test resolution from its config.json, with those weights
        (verified; `keras_efficientnet.runs.weights`).

        `overrides` replace or add constructor arguments, e.g. `input_shape=(64, 64, 3)`,
        `classes=10` or `weights="imagenet"` (G1-BN presets only).
        """
        from keras_efficientnet.models.presets import PRESETS, preset_config

        if preset not in PRESETS and os.path.isdir(str(preset).rpartition(":")[0] or preset):
            # A run is a preset too: its record names the preset, classes and resolution.
            from keras_efficientnet.runs import weights

            path, choice = weights.split_choice(str(preset))
            resolved, name, arguments = weights.run_preset(path, choice or "final")
            model = cls.from_preset(name, **{**arguments, **overrides})
            weights.load(resolved, model, named=f"preset {preset!r}")
            return model
        return cls(**{**preset_config(preset), **overrides})

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable, **self._config}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        if config.get("input_shape") is not None:
            config["input_shape"] = tuple(config["input_shape"])
        return cls(**config)
