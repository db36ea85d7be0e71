"""`import keras_efficientnet` loads no framework, yet Keras finds the package's classes by name
(keras_efficientnet/registration.py): in a fresh process, on first lookup."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from keras_efficientnet import registration
from tests.reliability.clitools import REPO, env

PACKAGE = REPO / "keras_efficientnet"


def _python(code: str, *args, timeout: float = 300) -> str:
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO, env=env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_importing_the_package_loads_no_framework_and_reads_no_command_line():
    # A command line that once made the package skip Keras, and one that did not: the same now.
    code = ("import sys; sys.orig_argv = sys.argv = sys.argv[1:]; import keras_efficientnet; "
            "print([m for m in ('keras', 'tensorflow', 'jax', 'numpy') if m in sys.modules])")
    for argv in (["python", "-m", "keras_efficientnet.train"], ["python", "notebook.py"]):
        assert _python(code, *argv).strip() == "[]"
    source = (PACKAGE / "__init__.py").read_text()
    assert "argv" not in source and "started_as_cli" not in source


def test_the_registering_modules_are_every_module_that_registers_a_class():
    registering = {
        ".".join(path.relative_to(REPO).with_suffix("").parts)
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^@keras\.saving\.register_keras_serializable\(", path.read_text(), re.M)}
    assert len(registering) >= 12
    assert registering == set(registration.REGISTERING_MODULES)


def test_the_lazy_registry_registers_only_for_our_missing_names(monkeypatch):
    calls = []

    def register():
        calls.append(1)
        registry["keras_efficientnet>Late"] = "late"

    monkeypatch.setattr(registration, "register", register)
    registry = registration.LazyRegistry({"Custom>Other": "other"})
    assert "Custom>Other" in registry and "Custom>Missing" not in registry
    assert registry.get("keras_efficientnet>Late") is None  # `get` never registers
    assert not calls
    assert "keras_efficientnet>Late" in registry and calls == [1]
    assert registry["keras_efficientnet>Late"] == "late" and calls == [1]  # now present
    with pytest.raises(KeyError):
        registry["keras_efficientnet>Nothing"]
    assert "keras_efficientnet>Nothing" not in registry and calls == [1, 1, 1]


def test_the_layers_package_names_the_normalization_function_not_its_module():
    import importlib

    import keras_efficientnet as ke

    module = importlib.import_module("keras_efficientnet.layers.normalization")
    assert ke.layers.normalization is module.normalization and callable(module.normalization)


LOAD = """
import json, sys
import keras_efficientnet
assert "keras" not in sys.modules, "the package imported Keras"
import keras
import numpy as np
model = keras.models.load_model(sys.argv[1])  # safe mode on
images = np.load(sys.argv[2])
print(json.dumps({
    "scores": model.predict(images, verbose=0).tolist(),
    "classes": sorted({type(layer).__module__ for layer in model._flatten_layers()}),
    "optimizer": type(model.optimizer).__module__,
    "schedule": type(model.optimizer._learning_rate).__module__,
    "iterations": int(model.optimizer.iterations.numpy()),
}))
"""


@pytest.mark.slow  # ~45 s on a busy 2-core machine; the next test checks the names at less cost
def test_a_fresh_process_loads_a_saved_model_after_import_keras_efficientnet(tmp_path):
    import keras

    import keras_efficientnet as ke

    keras.utils.set_random_seed(0)
    model = ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="group",
                            proxy_norm=True, classes=3, input_shape=(32, 32, 3))
    schedule = ke.optimizers.WarmupSchedule(0.01, warmup_steps=2, decay="cosine",
                                            total_steps=10)
    model.compile(optimizer=ke.optimizers.RMSPropTF(schedule),
                  loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 32, 32, 3)).astype("uint8")
    model.train_on_batch(images, np.arange(4) % 3)
    np.save(tmp_path / "images.npy", images)
    model.save(tmp_path / "model.keras")

    loaded = json.loads(_python(LOAD, tmp_path / "model.keras", tmp_path / "images.npy")
                        .strip().splitlines()[-1])
    np.testing.assert_allclose(loaded["scores"], model.predict(images, verbose=0), atol=1e-5)
    assert {"keras_efficientnet.layers.group_conv", "keras_efficientnet.layers.proxy_norm",
            "keras_efficientnet.layers.mbconv", "keras_efficientnet.models.efficientnet",
            } <= set(loaded["classes"])
    assert loaded["optimizer"] == "keras_efficientnet.optimizers.rmsprop_tf"
    assert loaded["schedule"] == "keras_efficientnet.optimizers.schedules"
    assert loaded["iterations"] == 1


LOOK_UP = """
import json, sys
import keras_efficientnet
from keras_efficientnet.registration import REGISTERING_MODULES
assert "keras" not in sys.modules, "the package imported Keras"
import keras
assert not set(REGISTERING_MODULES) & set(sys.modules), "registered before any lookup"
config = json.loads(sys.argv[1])
layer = keras.saving.deserialize_keras_object(config, safe_mode=True)
names = [f"keras_efficientnet>{name}" for name in sys.argv[2:]]
print(json.dumps([type(layer).__module__, layer.get_config()["group_size"],
                  [keras.saving.get_registered_object(name).__module__ for name in names]]))
"""


def test_a_fresh_process_finds_every_class_by_name_on_first_lookup():
    import keras

    import keras_efficientnet as ke

    config = keras.saving.serialize_keras_object(ke.layers.GroupConv2D(32, 3, group_size=8))
    classes = ["GroupConv2D", "ImageNormalization", "MBConvBlock", "ProxyNormActivation",
               "SqueezeExcite", "StochasticDepth", "GroupNormalization", "EfficientNet",
               "LARS", "RMSPropTF", "SGD", "WarmupSchedule"]
    module, group_size, modules = json.loads(
        _python(LOOK_UP, json.dumps(config), *classes).strip().splitlines()[-1])
    assert (module, group_size) == ("keras_efficientnet.layers.group_conv", 8)
    assert modules == [keras.saving.get_registered_object(f"keras_efficientnet>{name}")
                       .__module__ for name in classes]  # as in this process
    assert modules[-4:] == ["keras_efficientnet.optimizers.lars",
                            "keras_efficientnet.optimizers.rmsprop_tf",
                            "keras_efficientnet.optimizers.sgd",
                            "keras_efficientnet.optimizers.schedules"]


@pytest.mark.slow  # a second process that imports TensorFlow
def test_a_package_imported_after_keras_registers_at_once():
    code = ("import keras, keras_efficientnet\n"
            "from keras.src.saving import object_registration as registry\n"
            "print(type(registry.GLOBAL_CUSTOM_OBJECTS).__name__, sorted(\n"
            "    n for n in dict(registry.GLOBAL_CUSTOM_OBJECTS) if n.startswith('keras_ef')))")
    kind, names = _python(code).strip().splitlines()[-1].split(" ", 1)
    assert kind == "dict"  # Keras' own dict, filled at once (others may hold it already)
    names = json.loads(names.replace("'", '"'))
    assert len(names) == 12 and "keras_efficientnet>GroupConv2D" in names
