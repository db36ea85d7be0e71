"""Inference paths and exports of an EfficientNet, in its fused form or Keras' layers.

The fused forward pass lives in the layers: each layer that has one provides `fused_call`
(`keras_efficientnet.layers.fusion` says what each fuses), and an `EfficientNet` chains them
(`EfficientNet.fused_call`). The model chooses, in one place, which computation inference runs:
`model.fused_inference` ("auto": fused for LayerNorm/GroupNorm models computing in float32 on
TensorFlow, where the norms are most of the time; "on"; "off"), and `model(x)`, `predict`,
`predict_on_batch` and `evaluate` all follow it.

This module only wraps and exports:

- `for_inference(model, serving)`: what the package's inference paths run (the `predict`
  command and API) when they are asked for a choice that may differ from the model's setting:
  the model itself where it agrees, a `ServingModel` that runs the asked-for computation
  otherwise (the model's setting stays as it was);
- `export_saved_model(model, path, serving)`: a SavedModel of that computation, traced with
  only the ops TFLite's converter and tf2onnx take (`portable`);
- `serving_model(model)`: the fused pass as a Keras model of its own (benchmarks, exports).

XLA (`jit_compile=True`) is slower on a TensorFlow CPU for every variant here (measured in
benchmarks/README.md), so the wrapper's predict function is a plain `tf.function`.
"""

from __future__ import annotations

import keras

from keras_efficientnet.layers.fusion import FUSED_INFERENCE_CHOICES, check_choice

SERVING_CHOICES = FUSED_INFERENCE_CHOICES


def _fusable(model) -> bool:
    return callable(getattr(model, "fused_call", None)) and callable(getattr(model, "fuses",
                                                                             None))


def fuses(model: keras.Model, serving: str = "auto") -> bool:
    """Whether `serving` ("auto", "on", "off") runs `model`'s fused pass; a ValueError where
    "on" cannot (a model without a fused form, one that does not compute in float32)."""
    check_choice(serving, "serving")
    if isinstance(model, ServingModel):
        model = model.source
    if _fusable(model):
        return model.fuses(serving)
    if serving == "on":
        raise ValueError(f"serving=on: {model.name} has no fused inference form (an "
                         "EfficientNet has: keras_efficientnet.layers.fusion)")
    return False


def worth_serving(model: keras.Model) -> bool:
    """Whether "auto" takes the fused pass for `model`."""
    return fuses(model, "auto")


class ServingModel(keras.Model):
    """An EfficientNet's inference as a Keras model of its own: the same weights, input and
    outputs; its fused pass (`fused=True`) or Keras' layers (`fused=False`), whatever the
    model's `fused_inference` says.

    `predict`, `predict_on_batch` and `export` (a SavedModel with the model's input signature,
    traced with portable ops) work as on the model; train and save (`.keras`) the model, not the
    wrapper. (The wrapper leaves `trainable` alone: Keras would set it on the model, its
    sublayer, too.)
    """

    def __init__(self, model: keras.Model, fused: bool = True, **kwargs):
        fuses(model, "on" if fused else "off")  # a ValueError where it cannot
        if not _fusable(model):
            raise ValueError(f"ServingModel: {model.name} has no fused inference form (an "
                             "EfficientNet has)")
        super().__init__(name=f"{model.name}_serving", **kwargs)
        self.source = model
        self.fused = fused
        self.portable = False  # True while `export` traces
        self.built = True  # its layers are the model's, built already
        self.jit_compile = False  # XLA is slower on a TensorFlow CPU (module docstring)

    def call(self, images, training=False):
        if self.fused:
            return self.source.fused_call(images, portable=self.portable)
        return self.source(images, training=False, fused=False)

    def compute_output_shape(self, input_shape):
        return self.source.compute_output_shape(input_shape)

    def export(self, filepath, format="tf_saved_model", verbose=True, input_signature=None,
               **kwargs):
        """SavedModel of this computation with portable ops; the signature is the source
        model's input unless given."""
        if input_signature is None:
            import tensorflow as tf

            spec = self.source.inputs[0]
            input_signature = [tf.TensorSpec(spec.shape, spec.dtype, name="images")]
        self.portable = True  # traced here: a graph TFLite's converter and tf2onnx take
        try:
            return super().export(filepath, format=format, verbose=verbose,
                                  input_signature=input_signature, **kwargs)
        finally:
            self.portable = False


def serving_model(model: keras.Model) -> ServingModel:
    """`model`'s fused inference pass as a `ServingModel` (a ValueError where it has none or
    does not compute in float32)."""
    return ServingModel(model, fused=True)


def for_inference(model: keras.Model, serving: str = "auto") -> keras.Model:
    """The model an inference path runs for `serving` ("auto", "on", "off"): `model` itself
    where its own `fused_inference` makes the same choice, else a `ServingModel` running the
    asked-for computation (the model's setting is left as it was)."""
    fused = fuses(model, serving)
    if isinstance(model, ServingModel):
        return model if model.fused == fused else ServingModel(model.source, fused)
    if fused == (fuses(model, model.fused_inference) if _fusable(model) else False):
        return model
    return ServingModel(model, fused)


def export_saved_model(model: keras.Model, filepath, serving: str = "auto",
                       input_signature=None) -> bool:
    """Writes a SavedModel of `model`'s inference as `serving` chooses (`for_inference`),
    traced with portable ops; returns whether it is the fused pass."""
    fused = fuses(model, serving)
    source = model.source if isinstance(model, ServingModel) else model
    served = ServingModel(source, fused) if _fusable(source) else source
    served.export(str(filepath), format="tf_saved_model", verbose=False,
                  input_signature=input_signature)
    return fused
