"""An activation in a layer's config, written once for every layer that takes one."""

from __future__ import annotations

import keras


def activation_config(activation):
    """`activation` as a layer's `get_config` stores it: a name stays a name, a callable becomes
    Keras' serialized form (which `keras.activations.get` reads back)."""
    return activation if isinstance(activation, str) else keras.activations.serialize(activation)
