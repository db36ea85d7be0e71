"""What users of keras.applications and timm expect from the model: strict arguments, a stated
input, the preset list and feature maps by stride."""

from pathlib import Path

import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet.layers import ImageNormalization
from keras_efficientnet.models.presets import PAPER_TOP1


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_classes=10), r"unexpected keyword argument\(s\) 'num_classes' \(did you mean "
                           r"'classes'\?\); valid arguments: \['variant', 'group_size'"),
    (dict(input_size=(64, 64, 3)), r"'input_size' \(did you mean 'input_shape'\?\)"),
    (dict(pretrained=True), r"'pretrained'.*'weights'"),
])
def test_unknown_arguments_raise_type_error_naming_the_valid_ones(kwargs, match):
    with pytest.raises(TypeError, match=match):
        ke.EfficientNet("b0", **kwargs)
    with pytest.raises(TypeError, match=match):
        ke.EfficientNet.from_preset("efficientnet-b0-g16-lnpn", **kwargs)


def test_list_presets_filters_like_timm():
    assert ke.list_presets() == sorted(ke.models.PRESETS)
    assert len(ke.list_presets()) == 9 * 7  # b0..b7 and tiny, seven families
    assert ke.list_presets("*-b4-g16-*") == [
        "efficientnet-b4-g16-bn", "efficientnet-b4-g16-gn", "efficientnet-b4-g16-gnpn",
        "efficientnet-b4-g16-ln", "efficientnet-b4-g16-lnpn"]
    assert ke.list_presets("resnet*") == []


# Building even the tiny model takes about a minute under JAX on a loaded 2-core CPU (eager
# variable initialization); the checks themselves are backend-independent Python.
@pytest.mark.jax_cpu_slow
def test_float_images_are_refused_by_a_uint8_model():
    # Float input in [0, 255] goes to a model built with input_dtype="float32", whose outputs
    # equal the uint8 model's (test_efficientnet.py: test_uint8_and_float_images_give_...).
    model = ke.EfficientNet("tiny", classes=3, input_shape=(32, 32, 3), input_dtype="uint8")
    dark = np.full((1, 32, 32, 3), 0.5, "float32")  # an image in [0, 1]
    message = r"efficientnet_tiny takes uint8 images.*received float32.*input_dtype='float32'"
    with pytest.raises(ValueError, match=message):
        model(dark)
    with pytest.raises(ValueError, match=message):  # JAX's training step calls `call` directly
        model.stateless_call(model.trainable_variables, model.non_trainable_variables, dark)
    with pytest.raises(ValueError, match=r"input_dtype must be 'uint8'.*received 'bool'"):
        ke.EfficientNet("tiny", input_dtype="bool")
    with pytest.raises(ValueError, match="must be integer .uint8. or float pixels"):
        ImageNormalization()(np.zeros((1, 2, 2, 3), "bool"))


@pytest.mark.jax_cpu_slow
def test_feature_maps_by_stride_at_two_resolutions():
    backbone = ke.EfficientNet("tiny", include_top=False, input_shape=(None, None, 3))
    features = backbone.feature_maps()
    # Tiny: half width, so stage 2, 3, 5 and 7 end with 16, 24, 56 and 160 channels
    # (24, 40, 112, 320 halved, rounded to multiples of 8).
    channels = {"P2": 16, "P3": 24, "P4": 56, "P5": 160}
    for size in (64, 96):
        out = features(np.zeros((2, size, size, 3), "uint8"))
        assert {k: tuple(v.shape) for k, v in out.items()} == {
            k: (2, size // 2 ** int(k[1]), size // 2 ** int(k[1]), c)
            for k, c in channels.items()}
    # The backbone's own variables (not copies), up to the last block: no head conv.
    shared = {id(w) for w in backbone.weights}
    assert features.weights and all(id(w) in shared for w in features.weights)
    assert {w.path.split("/")[0] for w in backbone.weights} - {
        w.path.split("/")[0] for w in features.weights} == {"head_conv", "head_norm"}
    assert list(backbone.feature_maps(strides=(8, 32))(np.zeros((1, 64, 64, 3), "uint8"))) == [
        "P3", "P5"]
    with pytest.raises(ValueError, match=r"feature maps exist at strides \[2, 4, 8, 16, 32\], "
                                         r"received strides=\(64,\)"):
        backbone.feature_maps(strides=(64,))


def test_readme_preset_table_lists_every_preset():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("<!-- preset-table:begin -->")[1].split("<!-- preset-table:end -->")[0]
    rows = {line.split("`")[1]: line for line in table.splitlines() if line.startswith("| `")}
    assert sorted(rows) == ke.list_presets()  # regenerate: python scripts/preset_table.py
    # keras.applications.EfficientNetB0: 5,330,571 parameters, 0.39 G multiply-accumulates.
    assert "| 5.33 M | 0.388 G | 224 |" in rows["efficientnet-b0-g1-bn"]
    # The accuracy each preset's recipes aim at (the paper's Figure 1; Graphcore's B4 LARS run).
    assert rows["efficientnet-b0-g1-gn"].endswith("| 76.2 baseline, 79.1 fine-tuned native |")
    assert rows["efficientnet-b4-g16-gn"].endswith(
        "| 83.2 native, 82.8 half, ~82.6 LARS (Graphcore, no fine-tune) |")
    for (preset, recipe), top1 in PAPER_TOP1.items():
        assert f"{top1:.1f} " in rows[preset].rsplit("|", 2)[1], (preset, recipe)
