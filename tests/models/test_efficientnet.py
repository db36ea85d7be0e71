"""EfficientNet against keras.applications, closed-form MAC counts and batch independence."""

import math

import keras
import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet.layers import MBConvBlock
from keras_efficientnet.models import PRESETS, block_specs, round_filters
from tests.helpers import trainable_count

# Full-size builds and eager or fit-level runs of whole models take minutes under JAX on a CPU
# (model tracing, and XLA's slow grouped-conv backward); they run under TensorFlow, and the
# portable suite (test_portable.py) trains and saves a model under JAX.
JAX_CPU_SLOW = pytest.mark.jax_cpu_slow

KERAS_APPS = {
    "b0": keras.applications.EfficientNetB0, "b1": keras.applications.EfficientNetB1,
    "b2": keras.applications.EfficientNetB2, "b3": keras.applications.EfficientNetB3,
    "b4": keras.applications.EfficientNetB4, "b5": keras.applications.EfficientNetB5,
    "b6": keras.applications.EfficientNetB6, "b7": keras.applications.EfficientNetB7,
}


# B0, B1 and B3 in the default suite (B1 scales depth only, B3 width and depth, both rounding
# filters); B2, B4 and the largest builds, B5-B7 (20-50 s each on 2 cores), in `make
# test-slow`. B5's scaling is also checked in the default suite by the G16 count below.
@JAX_CPU_SLOW
@pytest.mark.parametrize("variant", [
    pytest.param(variant, marks=[] if variant in ("b0", "b1", "b3") else [pytest.mark.slow])
    for variant in KERAS_APPS])
def test_g1_batchnorm_trainable_parameters_equal_keras_applications(variant):
    ours = ke.EfficientNet(variant, input_shape=(64, 64, 3))
    reference = KERAS_APPS[variant](weights=None, input_shape=(64, 64, 3))
    assert trainable_count(ours) == trainable_count(reference)


@JAX_CPU_SLOW
def test_b0_macs_are_0_39_g_and_equal_keras_applications():
    ours = ke.count_macs(ke.EfficientNet("b0"))
    reference = ke.count_macs(keras.applications.EfficientNetB0(weights=None))
    assert ours == reference
    assert ours == pytest.approx(0.39e9, rel=0.01)


def test_macs_of_one_conv_by_hand():
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10)(x))
    assert ke.count_macs(model) == 3 * 3 * 3 * 8 * 16 * 16 + 8 * 10


@JAX_CPU_SLOW
def test_g16_costs_1_3_to_1_65_times_g1_at_equal_resolution():
    g1 = ke.count_macs(ke.EfficientNet("b0"))
    g16 = ke.count_macs(ke.EfficientNet.from_preset("efficientnet-b0-g16-gn"))
    assert 1.3 <= g16 / g1 <= 1.65


@JAX_CPU_SLOW
def test_macs_scale_with_resolution_squared():
    low = ke.count_macs(ke.EfficientNet("tiny", input_shape=(64, 64, 3)))
    high = ke.count_macs(ke.EfficientNet("tiny", input_shape=(128, 128, 3)))
    # The classifier and the squeeze-excite 1x1 convs on pooled features do not scale with the
    # resolution; everything else (all at even sizes down to 2x2) scales with the pixel count.
    fixed = round_filters(1280, 0.5) * 1000
    for spec in block_specs(0.5, 0.25):
        fixed += 2 * spec.filters_in * spec.expand_ratio * max(1, int(spec.filters_in * 0.25))
    assert high - fixed == 4 * (low - fixed)


@JAX_CPU_SLOW
def test_block_names_and_boundaries_follow_keras_applications():
    model = ke.EfficientNet("b0")
    reference = keras.applications.EfficientNetB0(weights=None)
    reference_blocks = sorted({layer.name.split("_")[0] for layer in reference.layers
                               if layer.name.startswith("block")})
    assert sorted(model.block_names) == reference_blocks
    groups = model.block_layers()
    assert list(groups) == ["stem", *model.block_names, "head"]
    assert [layer.name for layer in groups["head"]][:3] == ["head_conv", "head_norm", "head_act"]
    assert groups["block4a"][0].name == "block4a"


def test_block_specs_of_g16_b0():
    specs = block_specs(1.0, 1.0, group_size=16, expand_ratio=4)
    assert [s.expand_ratio for s in specs] == [1] + [4] * 15
    assert specs[0].filters_in * specs[0].expand_ratio == 32
    # Stochastic depth rises linearly with the block index to 0.2 * 15/16.
    np.testing.assert_allclose([s.drop_rate for s in specs], 0.2 * np.arange(16) / 16)


@JAX_CPU_SLOW
@pytest.mark.parametrize("norm,proxy", [("layer", True), ("group", False), ("group", True)])
def test_batch_independent_models_do_not_depend_on_the_batch(norm, proxy):
    model = ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm=norm, proxy_norm=proxy,
                            classes=5)
    images = np.random.default_rng(0).integers(0, 256, (4, 64, 64, 3)).astype("uint8")
    whole = keras.ops.convert_to_numpy(model(images, training=True))
    single = np.concatenate([keras.ops.convert_to_numpy(model(images[i:i + 1], training=True))
                             for i in range(4)])
    # training=True, yet no batch statistics: each sample's output is its own (dropout and
    # stochastic depth aside, which are switched off by comparing in inference mode too).
    whole_inf = keras.ops.convert_to_numpy(model(images, training=False))
    single_inf = np.concatenate([keras.ops.convert_to_numpy(model(images[i:i + 1]))
                                 for i in range(4)])
    np.testing.assert_allclose(whole_inf, single_inf, rtol=1e-4, atol=1e-6)
    assert whole.shape == single.shape == (4, 5)


@JAX_CPU_SLOW
def test_batchnorm_model_does_depend_on_the_batch_in_training():
    # The counterpart of the test above, so that one can fail: BatchNorm mixes samples.
    model = ke.EfficientNet("tiny", classes=5, dropout_rate=0.0, drop_connect_rate=0.0)
    images = np.random.default_rng(0).integers(0, 256, (4, 64, 64, 3)).astype("uint8")
    whole = keras.ops.convert_to_numpy(model(images, training=True))
    part = keras.ops.convert_to_numpy(model(images[:2], training=True))
    assert np.abs(whole[:2] - part).max() > 1e-4


# JAX_CPU_SLOW: 3 eager whole-model calls, 25 s of make test-jax (quiet). The cast is keras.ops,
# the same on every backend; under JAX, uint8 images go through the model in test_portable's
# training step and test_serialization's round trip.
@JAX_CPU_SLOW
def test_uint8_and_float_images_give_the_same_output():
    # The default model takes both (keras.applications' habit); uint8 is cast inside it.
    model = ke.EfficientNet("tiny", classes=3)
    assert model.input.dtype == "float32"
    images = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3))
    uint8_model = ke.EfficientNet("tiny", classes=3, input_dtype="uint8")
    uint8_model.set_weights(model.get_weights())
    reference = keras.ops.convert_to_numpy(uint8_model(images.astype("uint8")))
    for dtype in ("uint8", "float32"):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(model(images.astype(dtype))),
                                   reference, rtol=1e-5, atol=1e-6)


@JAX_CPU_SLOW
def test_any_resolution_and_headless_pooling():
    model = ke.EfficientNet("tiny", input_shape=(None, None, 3), include_top=False,
                            pooling="avg")
    for size in (64, 96):
        out = model(np.zeros((1, size, size, 3), "uint8"))
        assert out.shape == (1, round_filters(1280, 0.5))


@JAX_CPU_SLOW
def test_mixed_precision_computes_in_bfloat16_with_a_float32_classifier():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="layer",
                                proxy_norm=True, classes=3, input_shape=(32, 32, 3))
    finally:
        keras.config.set_dtype_policy(previous)
    assert model.get_layer("block2a").compute_dtype == "bfloat16"
    assert model.get_layer("block2a").variable_dtype == "float32"
    out = model(np.zeros((2, 32, 32, 3), "uint8"))
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


@pytest.mark.parametrize("kwargs,match", [
    (dict(variant="b8"), r"variant must be one of \['b0'"),
    (dict(norm="instance"), r"norm must be one of \['batch', 'group', 'layer'\]"),
    (dict(norm="batch", proxy_norm=True), "proxy_norm=True needs a batch-independent norm"),
    (dict(variant="b6", group_size=16, expand_ratio=4, norm="group"),
     r"block1a \(spatial conv\): group_size=16 gives max\(56 // 16, 1\) = 3 groups.*"
     r"first_stage_group_size"),
    (dict(input_shape=(224, 224)), r"input_shape must be \(height, width, 3\)"),
    (dict(input_shape=(16, 16, 3)), "ints >= 32"),
    (dict(input_shape=(224, 224, 1)), "RGB"),
    (dict(pooling="sum", include_top=False), "pooling must be one of"),
    (dict(expand_ratio=0), "expand_ratio must be a positive int"),
    (dict(input_normalization="std"), r"input_normalization must be one of \['mean_std', "
                                      r"'mean'\], received 'std'"),
])
def test_bad_arguments_fail_with_a_clear_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ke.EfficientNet(**kwargs)


def test_presets_cover_b0_to_b7_for_four_families():
    for variant in KERAS_APPS:
        for family in ("g1-bn", "g1-gn", "g16-gn", "g16-lnpn"):
            assert f"efficientnet-{variant}-{family}" in PRESETS
    assert PRESETS["efficientnet-b4-g16-lnpn"]["expand_ratio"] == 4
    with pytest.raises(ValueError, match="unknown preset 'efficientnet-b9'"):
        ke.EfficientNet.from_preset("efficientnet-b9")


# Parameter counts of G16 written out from the B0 stage table (Tan & Le 2019, table 1), the
# scaling coefficients and Graphcore's grouping rule, without calling the model code.
STAGES = [(3, 1, 32, 16, 1), (3, 2, 16, 24, 6), (5, 2, 24, 40, 6), (3, 3, 40, 80, 6),
          (5, 3, 80, 112, 6), (5, 4, 112, 192, 6), (3, 1, 192, 320, 6)]
WIDTH_DEPTH = {"b0": (1.0, 1.0), "b1": (1.0, 1.1), "b2": (1.1, 1.2), "b3": (1.2, 1.4),
               "b4": (1.4, 1.8), "b5": (1.6, 2.2)}
DEFAULT_G16_COUNTS = {("b0", "group"), ("b3", "group"), ("b5", "group"), ("b0", "layer")}


def _channels(filters, width):
    scaled = filters * width
    rounded = max(8, int(scaled + 4) // 8 * 8)
    return rounded + 8 if rounded < 0.9 * scaled else rounded


def g16_parameter_count(variant, proxy_norm, classes=1000):
    """Trainable parameters of G16 (expand 4, group size 16): per conv max(C // 16, 1) groups.

    GroupNorm carries gamma and beta (2 per channel); with LayerNorm + Proxy Norm the norm has
    no affine and the proxy-normalized activation holds gamma, beta, proxy beta and proxy gamma
    (4 per channel), and the projection's norm keeps a scale only.
    """
    width, depth = WIDTH_DEPTH[variant]
    act_norm = 4 if proxy_norm else 2
    stem = _channels(32, width)
    total = 3 * 3 * 3 * stem + act_norm * stem
    for kernel, repeats, c_in, c_out, expand in STAGES:
        c_in, c_out = _channels(c_in, width), _channels(c_out, width)
        expand = 1 if expand == 1 else 4
        for j in range(math.ceil(depth * repeats)):
            block_in = c_in if j == 0 else c_out
            hidden = block_in * expand
            if expand != 1:
                total += block_in * hidden + act_norm * hidden
            groups = max(hidden // 16, 1)
            total += kernel * kernel * (hidden // groups) * hidden + act_norm * hidden
            squeeze = max(1, int(block_in * 0.25))
            total += hidden * squeeze + squeeze + squeeze * hidden + hidden
            total += hidden * c_out + (1 if proxy_norm else 2) * c_out
        last = c_out
    head = _channels(1280, width)
    return total + last * head + act_norm * head + head * classes + classes


def test_g16_count_of_one_block_by_hand():
    # B4's block1a: 48 channels, expand 1, 3 groups of 16 -> kernel 3 x 3 x 16 x 48 (not the
    # 3 x 3 x 12 x 48 of 4 groups of 12), GN 2 x 48, SE 48 -> 12 -> 48, project 48 -> 24 + GN.
    block = MBConvBlock(48, 24, expand_ratio=1, group_size=16, norm="group", name="block1a")
    block.build((1, 8, 8, 48))
    assert tuple(block.ordered_layers[0].kernel.shape) == (3, 3, 16, 48)
    expected = 9 * 16 * 48 + 2 * 48 + (48 * 12 + 12 + 12 * 48 + 48) + 48 * 24 + 2 * 24
    assert trainable_count(block) == expected


# B0, B3 and B5 with GroupNorm and B0 with LayerNorm + Proxy Norm in the default suite; B1, B2,
# B4 and B4 with LN+PN (the larger builds, 3-8 s each on 2 cores) in `make test-slow`.
@JAX_CPU_SLOW
@pytest.mark.parametrize("variant,norm", [
    pytest.param(variant, norm, marks=[] if (variant, norm) in DEFAULT_G16_COUNTS
                 else [pytest.mark.slow])
    for variant, norm in [*[(v, "group") for v in WIDTH_DEPTH], ("b0", "layer"), ("b4", "layer")]])
def test_g16_parameter_counts_follow_graphcores_grouping_rule(variant, norm):
    # The paper's arguments build it (no stage-1 override), and so do the presets.
    arguments = dict(group_size=16, expand_ratio=4, input_normalization="mean", norm=norm)
    if norm == "layer":
        arguments["proxy_norm"] = True
    model = ke.EfficientNet(variant, input_shape=(32, 32, 3), **arguments)
    assert trainable_count(model) == g16_parameter_count(variant, norm == "layer")
    family = "g16-lnpn" if norm == "layer" else "g16-gn"
    assert PRESETS[f"efficientnet-{variant}-{family}"] == {"variant": variant, **arguments}


@JAX_CPU_SLOW
def test_proxy_norm_scales_as_graphcore_places_them():
    model = ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="layer", proxy_norm=True,
                            classes=3, input_shape=(32, 32, 3))
    assert model.get_layer("stem_act").scale_output
    assert not model.get_layer("head_act").scale_output  # dropped before pooling and the FC
    block = model.get_layer("block2a")
    spatial = next(layer for layer in block.ordered_layers if layer.name == "spatial_act")
    expand = next(layer for layer in block.ordered_layers if layer.name == "expand_act")
    assert block.gate_scale_source is spatial and not spatial.scale_output
    assert expand.scale_output


@JAX_CPU_SLOW
def test_input_normalization_subtracts_graphcores_mean_or_applies_keras_mean_and_std():
    images = np.random.default_rng(0).integers(0, 256, (1, 32, 32, 3)).astype("uint8")
    mean_std = ke.EfficientNet("tiny", input_shape=(32, 32, 3)).get_layer("normalize")
    mean_only = ke.EfficientNet.from_preset("efficientnet-tiny-g16-lnpn",
                                            input_shape=(32, 32, 3)).get_layer("normalize")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(mean_only(images)),
                               images - np.array([123.68, 116.78, 103.94]), rtol=1e-6, atol=1e-4)
    expected = (images - np.array([0.485, 0.456, 0.406]) * 255) / (
        np.array([0.229, 0.224, 0.225]) * 255)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(mean_std(images)), expected,
                               rtol=1e-5, atol=1e-5)
    assert "input_normalization" not in PRESETS["efficientnet-b0-g1-bn"]


def test_b6_g16_preset_documents_its_stage_1_variant():
    assert PRESETS["efficientnet-b6-g16-gn"]["first_stage_group_size"] == 14
    assert "first_stage_group_size" not in PRESETS["efficientnet-b5-g16-gn"]
    assert "first_stage_group_size" not in PRESETS["efficientnet-b7-g16-lnpn"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds(preset):
    model = ke.EfficientNet.from_preset(preset, input_shape=(32, 32, 3), classes=2)
    assert model(np.zeros((1, 32, 32, 3), "uint8")).shape == (1, 2)
