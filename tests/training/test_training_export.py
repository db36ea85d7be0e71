"""What a training run leaves behind, loaded where users load it: a fresh Python process.

The trainer's writer (`trainer.save_outputs`) writes model.keras, class_names.json and a
SavedModel for a two-class image folder; one subprocess (safe mode on) loads them and models
compiled with each optimizer, checks every public class is registered, and runs `predict`. A
slow test does the same after a whole train-and-fine-tune run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

import keras_efficientnet as ke
from keras_efficientnet.cli import predict
from keras_efficientnet.training import TrainConfig, trainer
from tests.helpers import softmax

pytestmark = pytest.mark.tf_only

REPO = Path(__file__).resolve().parents[2]
CLASSES = ("cat", "dog")
SIZE = 32


def _write_folder(root: Path) -> dict[str, list[Path]]:
    """root/<split>/<cat|dog>/*.png: reddish cats, bluish dogs, 40x48 pixels."""
    rng = np.random.default_rng(0)
    files = {}
    for split, count in (("train", 8), ("validation", 2)):
        for label, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                image = rng.integers(0, 96, (40, 48, 3), dtype=np.uint8)
                image[..., 0 if label == 0 else 2] += 150
                path = folder / f"{i}.png"
                Image.fromarray(image).save(path)
                files.setdefault(split, []).append(path)
    return files


def _config(root: Path, **changes) -> TrainConfig:
    return TrainConfig(**{**dict(
        mode="train", model="efficientnet-tiny-g16-lnpn", dataset=f"folder:{root / 'pets'}",
        model_dir=str(root / "run"), export_dir=str(root / "saved_model"),
        train_resolution=SIZE, test_resolution=SIZE, micro_batch_size=4, epochs=1,
        updates_per_epoch=2, finetune_epochs=1, eval_steps=1, optimizer="sgd", learning_rate=0.01,
        lr_schedule="cosine", warmup_epochs=0.0, label_smoothing=0.0, random_flip=False,
        verbose=0, seed=1), **changes})


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The trainer's outputs for a (logits) model with perturbed weights."""
    root = tmp_path_factory.mktemp("export")
    files = _write_folder(root / "pets")
    config = _config(root)
    model = trainer.build_model(config, SIZE, len(CLASSES))
    rng = np.random.default_rng(2)
    model.set_weights([w + 0.05 * rng.standard_normal(w.shape) for w in model.get_weights()])
    written = trainer.save_outputs(config, model)
    return dict(root=root, files=files, config=config, model=model, written=written)


def _optimizer_models(folder: Path) -> dict[str, str]:
    """A small model compiled with each of the package's optimizers and its schedule, saved."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    schedule = ke.optimizers.WarmupSchedule(0.1, 5, "cosine", total_steps=50)
    paths = {}
    for optimizer in (ke.optimizers.LARS(schedule), ke.optimizers.RMSPropTF(schedule),
                      ke.optimizers.SGD(schedule, momentum=0.9)):
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        optimizer.build(model.trainable_variables)  # its slots are saved and loaded too
        name = type(optimizer).__name__
        paths[name] = str(folder / f"{name}.keras")
        model.save(paths[name])
    return paths


FRESH_PROCESS = """
import contextlib, io, json, sys
import keras
import numpy as np
import tensorflow as tf
import keras_efficientnet as ke
args = json.loads(sys.argv[1])
out = {}
images = np.asarray(args["images"], "uint8")
model = ke.load_model(args["model_file"], safe_mode=True)  # registers our classes first
out["model_probabilities"] = model.predict(images, verbose=0).tolist()
serving = tf.saved_model.load(args["export_dir"]).signatures["serving_default"]
spec = serving.structured_input_signature[1]
(key, spec), = spec.items()
out["signature"] = [spec.dtype.name, list(spec.shape)]
out["saved_model_probabilities"] = next(iter(serving(**{key: tf.constant(images)}).values())
                                        ).numpy().tolist()
out["optimizers"] = {}
ke.register()  # the documented way before a bare keras.models.load_model
for name, path in args["optimizer_models"].items():
    loaded = keras.models.load_model(path, safe_mode=True)
    out["optimizers"][name] = [type(loaded.optimizer).__name__,
                               type(loaded.optimizer._learning_rate).__name__]
# Every public layer, model, optimizer and schedule is registered after ke.register().
kinds = (keras.layers.Layer, keras.optimizers.Optimizer,
         keras.optimizers.schedules.LearningRateSchedule)
public = [getattr(module, name) for module in (ke, ke.layers, ke.models, ke.optimizers)
          for name in module.__all__]
classes = {c for c in public if isinstance(c, type) and issubclass(c, kinds)}
out["registered"] = sorted(c.__name__ for c in classes if keras.saving.get_registered_object(
    keras.saving.get_registered_name(c)) is c)
out["unregistered"] = sorted(c.__name__ for c in classes) and sorted(
    c.__name__ for c in classes if c.__name__ not in out["registered"])
from keras_efficientnet.cli import predict
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    out["predict_rc"] = predict.main(["predict", "--model_file=" + args["model_file"],
                                      *args["image_files"]])
out["predict_stdout"] = printed.getvalue()
print("RESULT " + json.dumps(out))
"""


def _run_fresh_process(model_file, export_dir, image_files, folder):
    images = np.stack([np.asarray(Image.open(path).resize((SIZE, SIZE))) for path in image_files])
    args = dict(model_file=str(model_file), export_dir=str(export_dir), images=images.tolist(),
                image_files=[str(p) for p in image_files],
                optimizer_models=_optimizer_models(folder))
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, json.dumps(args)], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return images, json.loads(done.stdout.split("RESULT ", 1)[1])


def test_a_fresh_process_loads_the_outputs_and_every_optimizer(outputs, tmp_path):
    config, written, files = outputs["config"], outputs["written"], outputs["files"]
    model_file = Path(config.model_dir) / "model.keras"
    assert written == {"model_file": str(model_file), "export_dir": config.export_dir}
    assert json.loads((model_file.parent / "class_names.json").read_text()) == list(CLASSES)
    image_files = [files["validation"][0], files["validation"][-1]]
    images, out = _run_fresh_process(model_file, config.export_dir, image_files, tmp_path)

    # model.keras: the model's weights with a softmax head (the trainer's model emits logits).
    expected = softmax(keras.ops.convert_to_numpy(outputs["model"](images)).astype("float64"))
    assert expected.max() - expected.min() > 0.05  # the two images and classes differ
    np.testing.assert_allclose(out["model_probabilities"], expected, rtol=1e-5, atol=1e-6)
    # The SavedModel: uint8 images of the model's size in, the same probabilities out.
    assert out["signature"] == ["uint8", [None, SIZE, SIZE, 3]]
    np.testing.assert_allclose(out["saved_model_probabilities"], expected, rtol=1e-4, atol=1e-6)

    assert out["optimizers"] == {name: [name, "WarmupSchedule"]
                                 for name in ("LARS", "RMSPropTF", "SGD")}
    assert out["unregistered"] == []
    assert {"EfficientNet", "GroupConv2D", "ImageNormalization", "LARS", "MBConvBlock",
            "ProxyNormActivation", "RMSPropTF", "SGD", "SqueezeExcite", "StochasticDepth",
            "WarmupSchedule"} <= set(out["registered"])

    # predict: both classes, ranked by the model's probabilities, with their names. (It crops
    # the centre of each 40x48 image, so its probabilities differ a little from the resized
    # images' above; the ranking is checked against its own crops.)
    assert out["predict_rc"] == 0
    printed = out["predict_stdout"].splitlines()
    assert printed[0] == str(image_files[0]) and printed[3] == str(image_files[1])
    crops = predict.predict(outputs["model"], [str(p) for p in image_files], SIZE)
    for row, lines in ((0, printed[1:3]), (1, printed[4:6])):
        order = np.argsort(-crops[row], kind="stable")
        assert [line.split()[1] for line in lines] == [CLASSES[i] for i in order]
        assert float(lines[0].split()[2]) == pytest.approx(crops[row][order[0]], abs=2e-4)


@pytest.mark.slow
def test_a_training_run_writes_the_fine_tuned_model_and_its_export(tmp_path):
    _write_folder(tmp_path / "pets")
    config = _config(tmp_path, mode="train_and_finetune")
    results = trainer.train_and_evaluate(config)
    model_file = Path(config.model_dir) / "model.keras"
    assert results["model_file"] == str(model_file)
    assert results["export_dir"] == config.export_dir
    tuned = trainer.build_model(config, SIZE, len(CLASSES))
    tuned.load_weights(Path(config.model_dir) / "finetuned.weights.h5")
    saved = keras.models.load_model(model_file)
    for ours, theirs in zip(saved.get_weights(), tuned.get_weights()):
        np.testing.assert_array_equal(ours, theirs)
    images = np.zeros((1, SIZE, SIZE, 3), "uint8")
    np.testing.assert_allclose(saved.predict(images, verbose=0),
                               softmax(tuned.predict(images, verbose=0)), rtol=1e-5, atol=1e-6)
