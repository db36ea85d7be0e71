"""`import keras_efficientnet` loads no framework and installs no import hook; every face lists
its names (keras_efficientnet/lazy.py); `ke.load_model` and `ke.register()` let Keras find the
package's classes by name in a fresh process (keras_efficientnet/registration.py)."""

from __future__ import annotations

import importlib
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


def test_importing_the_package_loads_no_framework_hooks_no_import_nor_reads_the_command_line():
    # A command line that once made the package skip Keras, and one that did not: the same now.
    code = ("import sys; sys.orig_argv = sys.argv = sys.argv[1:]; finders = list(sys.meta_path)\n"
            "import keras_efficientnet as ke; dir(ke); ke.__all__\n"
            "print([m for m in ('keras', 'tensorflow', 'jax', 'numpy') if m in sys.modules],"
            " sys.meta_path == finders)")
    for argv in (["python", "-m", "keras_efficientnet.train"], ["python", "notebook.py"]):
        assert _python(code, *argv).strip() == "[] True"
    source = (PACKAGE / "__init__.py").read_text()
    assert "argv" not in source and "started_as_cli" not in source
    assert "meta_path" not in (PACKAGE / "registration.py").read_text()


FACES = ("keras_efficientnet", "keras_efficientnet.layers", "keras_efficientnet.models",
         "keras_efficientnet.datasets", "keras_efficientnet.training",
         "keras_efficientnet.distribute")


@pytest.mark.parametrize("name", FACES)
def test_every_face_lists_and_loads_each_of_its_names(name):
    """`dir()` (and so completion) shows every public name before it loads, and each loads;
    the face's source uses the one helper (no `__getattr__` of its own)."""
    face = importlib.import_module(name)
    listed = dir(face)
    assert set(face.__all__) <= set(listed)
    assert len(face.__all__) == len(set(face.__all__))
    for public in face.__all__:
        assert getattr(face, public) is not None, public
    source = (REPO / name.replace(".", "/") / "__init__.py").read_text()
    assert "lazy_face(__name__, _EXPORTS" in source and "def __getattr__" not in source
    with pytest.raises(AttributeError, match=f"module '{name}' has no attribute 'nothing'"):
        face.nothing  # noqa: B018 - the lookup is the test


def test_the_faces_keep_their_public_names():
    """Names the faces offered before the one helper (issue 34), by face: each still there."""
    import keras_efficientnet as ke

    before = {
        ke: ["layers", "models", "optimizers", "datasets", "training", "distribute", "cli",
             "EfficientNet", "count_macs", "decode_predictions", "list_presets",
             "list_recipes"],
        ke.layers: ["GroupConv2D", "ImageNormalization", "MBConvBlock", "ProxyNormActivation",
                    "SqueezeExcite", "StochasticDepth", "conv_kernel_initializer",
                    "normal_quantiles", "normalization", "num_groups"],
        ke.models: ["B0_STAGES", "PRESETS", "SCALING", "VARIANTS", "BlockSpec", "EfficientNet",
                    "block_specs", "count_macs", "decode_predictions", "imagenet_class_names",
                    "imagenet_classes", "layer_macs", "list_presets", "preset_config",
                    "preset_name", "round_filters", "round_repeats"],
        ke.training: ["TrainConfig", "NonFiniteLossError", "CheckpointManager", "RunSession",
                      "build_model", "finetune", "train_and_evaluate", "RunDirError"],
        ke.distribute: ["ExecutionPlan", "STRATEGY_TABLE", "make_runtime", "run", "fit",
                        "MirroredRuntime", "PipelinedModel", "plan_splits"],
        ke.datasets: ["InputOptions", "make_dataset", "center_crop", "mixup", "DatasetInfo",
                      "parse_source", "prepare_digits", "SKIPPED"],
    }
    for face, names in before.items():
        assert set(names) <= set(face.__all__), face.__name__
    assert ke.distribute.launch.__name__ == "keras_efficientnet.distribute.launch"
    assert "launch" in dir(ke.distribute) and "launch" not in ke.distribute.__all__
    assert {"load_model", "register"} <= set(ke.__all__)


def test_the_registering_modules_are_every_module_that_registers_a_class():
    registering = {
        ".".join(path.relative_to(REPO).with_suffix("").parts)
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^@keras\.saving\.register_keras_serializable\(", path.read_text(), re.M)}
    assert len(registering) >= 12
    assert registering == set(registration.REGISTERING_MODULES)


def test_the_package_loads_saved_models_through_registration():
    """No hook: Keras finds our classes in a fresh process only after `register()`, so every
    load in the package goes through `registration.load_model` (which registers first)."""
    import ast

    def loads_bare(path) -> bool:
        return any(isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "keras.models.load_model", "keras.saving.load_model")
            for node in ast.walk(ast.parse(path.read_text())))

    bare = [str(path.relative_to(REPO)) for path in PACKAGE.rglob("*.py")
            if path.name != "registration.py" and loads_bare(path)]
    assert bare == []
    assert loads_bare(PACKAGE / "registration.py")  # the check sees such a call


def test_the_layers_package_names_the_normalization_function_not_its_module():
    import importlib

    import keras_efficientnet as ke

    module = importlib.import_module("keras_efficientnet.layers.normalization")
    assert ke.layers.normalization is module.normalization and callable(module.normalization)


LOAD = """
import json, sys
import keras_efficientnet as ke
assert "keras" not in sys.modules, "the package imported Keras"
import keras
import numpy as np
if sys.argv[3] == "register":  # the documented way for a bare keras.models.load_model
    ke.register()
    model = keras.models.load_model(sys.argv[1])  # safe mode on
else:
    model = ke.load_model(sys.argv[1])
images = np.load(sys.argv[2])
print(json.dumps({
    "scores": model.predict(images, verbose=0).tolist(),
    "classes": sorted({type(layer).__module__ for layer in model._flatten_layers()}),
    "optimizer": type(model.optimizer).__module__,
    "schedule": type(model.optimizer._learning_rate).__module__,
    "iterations": int(model.optimizer.iterations.numpy()),
}))
"""


@pytest.mark.slow  # ~90 s on a busy 2-core machine; the next test checks the names at less cost
def test_a_fresh_process_loads_a_saved_model_with_load_model_or_after_register(tmp_path):
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

    for how in ("load_model", "register"):
        loaded = json.loads(_python(LOAD, tmp_path / "model.keras", tmp_path / "images.npy",
                                    how).strip().splitlines()[-1])
        np.testing.assert_allclose(loaded["scores"], model.predict(images, verbose=0),
                                   atol=1e-5)
        assert {"keras_efficientnet.layers.group_conv", "keras_efficientnet.layers.proxy_norm",
                "keras_efficientnet.layers.mbconv", "keras_efficientnet.models.efficientnet",
                } <= set(loaded["classes"])
        assert loaded["optimizer"] == "keras_efficientnet.optimizers.rmsprop_tf"
        assert loaded["schedule"] == "keras_efficientnet.optimizers.schedules"
        assert loaded["iterations"] == 1


LOOK_UP = """
import json, sys
import keras_efficientnet as ke
from keras_efficientnet.registration import REGISTERING_MODULES
assert "keras" not in sys.modules, "the package imported Keras"
import keras
assert not set(REGISTERING_MODULES) & set(sys.modules), "registered before register()"
config = json.loads(sys.argv[1])
try:  # no hook: before register(), Keras does not know the name
    keras.saving.deserialize_keras_object(config, safe_mode=True)
    unknown = ""
except Exception as error:
    unknown = str(error)
ke.register()
layer = keras.saving.deserialize_keras_object(config, safe_mode=True)
names = [f"keras_efficientnet>{name}" for name in sys.argv[2:]]
print(json.dumps([unknown, type(layer).__module__, layer.get_config()["group_size"],
                  [keras.saving.get_registered_object(name).__module__ for name in names],
                  type(keras.saving.get_custom_objects()).__name__]))
"""


def test_register_makes_every_class_findable_by_name_in_a_fresh_process():
    import keras

    import keras_efficientnet as ke

    config = keras.saving.serialize_keras_object(ke.layers.GroupConv2D(32, 3, group_size=8))
    classes = ["GroupConv2D", "ImageNormalization", "MBConvBlock", "ProxyNormActivation",
               "SqueezeExcite", "StochasticDepth", "GroupNormalization", "EfficientNet",
               "LARS", "RMSPropTF", "SGD", "WarmupSchedule"]
    unknown, module, group_size, modules, registry = json.loads(
        _python(LOOK_UP, json.dumps(config), *classes).strip().splitlines()[-1])
    assert "GroupConv2D" in unknown  # Keras' own error before register()
    assert (module, group_size) == ("keras_efficientnet.layers.group_conv", 8)
    assert modules == [keras.saving.get_registered_object(f"keras_efficientnet>{name}")
                       .__module__ for name in classes]  # as in this process
    assert modules[-4:] == ["keras_efficientnet.optimizers.lars",
                            "keras_efficientnet.optimizers.rmsprop_tf",
                            "keras_efficientnet.optimizers.sgd",
                            "keras_efficientnet.optimizers.schedules"]
    assert registry == "dict"  # Keras' own registry, untouched
