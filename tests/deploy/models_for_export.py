"""Models and images the deploy tests share: presets whose norm statistics, affines and proxy
parameters are moved off their initial values, so that every fold is exercised."""

from __future__ import annotations

import keras
import numpy as np

import keras_efficientnet as ke

_BUILT: dict = {}


def perturbed(preset: str, resolution: int = 32, seed: int = 7, **overrides) -> keras.Model:
    """`preset` at `resolution` with 10 classes; gammas, betas, moving statistics and proxy
    parameters moved (ones and zeros would hide a gamma or beta used in the wrong place).
    Built once per process and arguments (B0 takes seconds): tests only read it."""
    key = (preset, resolution, seed, tuple(sorted(overrides.items())))
    if key not in _BUILT:
        _BUILT[key] = _perturbed(preset, resolution, seed, **overrides)
    return _BUILT[key]


def _perturbed(preset: str, resolution: int, seed: int, **overrides) -> keras.Model:
    keras.utils.set_random_seed(seed)  # the kernels: the perturbation below moves the rest
    model = ke.EfficientNet.from_preset(
        preset, **{"input_shape": (resolution, resolution, 3), "classes": 10, **overrides})
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if any(key in weight.path for key in ("gamma", "beta", "proxy", "moving")):
            value = keras.ops.convert_to_numpy(weight) + 0.3 * rng.standard_normal(
                weight.shape).astype("float32")
            weight.assign(np.abs(value) + 0.05 if "variance" in weight.path else value)
    return model


def images(batch: int = 3, resolution: int = 32) -> np.ndarray:
    """Random uint8 images, then a white and a black one: a near-constant feature map is where
    statistics computed as E[x^2] - E[x]^2 would lose their digits."""
    rng = np.random.default_rng(0)
    return np.concatenate([
        rng.integers(0, 256, (batch, resolution, resolution, 3)).astype("uint8"),
        np.full((1, resolution, resolution, 3), 255, "uint8"),
        np.zeros((1, resolution, resolution, 3), "uint8")])


def keras_outputs(model: keras.Model, x: np.ndarray) -> np.ndarray:
    """Keras' layers one by one (not the fused pass the exporter mirrors), computing in
    float64 with the model's weights: at B0 the float32 model is itself up to 5e-6 of the
    output scale away from it, and a float32 export as far on the other side."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        reference = type(model).from_config(model.get_config())
    finally:
        keras.config.set_dtype_policy(previous)
    reference.set_weights(model.get_weights())
    outputs = reference(x.astype("float64"), training=False, fused=False)
    return keras.ops.convert_to_numpy(outputs).astype("float32")


def assert_close(actual, expected, tolerance: float = 1e-5, scale: float | None = None,
                 floor: float = 0.0) -> None:
    """Equal to `tolerance` of the output's scale (the issue's criterion; `scale`, default the
    largest of `expected`, for a slice of a batch whose scale is the batch's): float32 sums in
    another order differ by round-off. `floor`, an absolute bound below which no difference
    fails (`float32_roundoff`'s measure, where the float32 model is itself that far off)."""
    scale = max(float(np.abs(expected).max()) if scale is None else scale, 1e-3)
    assert np.abs(expected).max() > 1e-3  # not a trivially zero output
    np.testing.assert_allclose(actual, expected, rtol=0, atol=max(tolerance * scale, floor))


def float32_roundoff(model: keras.Model, x: np.ndarray, expected: np.ndarray) -> float:
    """How far the float32 model's own layers (one by one, not the fused pass an export
    mirrors) lie from `expected` (keras_outputs' float64 ones) on this machine: a float32
    export, another order of the same sums, cannot be held much closer. At B0 it is 5e-6 to
    9e-6 of the output scale, and which CPU kernels run (oneDNN's, or ONNX Runtime's on
    AVX-512 and AVX2) moves it. Asserted under 2e-5 of the scale, so that it stays a bound
    on round-off."""
    outputs = keras.ops.convert_to_numpy(model(x, training=False, fused=False))
    roundoff = float(np.abs(outputs - expected).max())
    assert roundoff < 2e-5 * float(np.abs(expected).max()), roundoff
    return roundoff
