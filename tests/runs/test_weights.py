"""runs.weights: one resolver for every weights form, each verified as far as it can be, and a
damaged checkpoint or model file refused in one line from every entry point (issue 36: before,
`--init_checkpoint=<checkpoint folder>` loaded and scored content that no longer matched its
manifest)."""

from __future__ import annotations

import json
import shutil
import zipfile

import keras
import numpy as np
import pytest

from keras_efficientnet.runs import record, weights
from keras_efficientnet.runs.weights import WeightsError
from keras_efficientnet.training import TrainConfig
from keras_efficientnet.training.builders import build_model
from keras_efficientnet.training.checkpoint import CheckpointManager
from keras_efficientnet.training.export import inference_model

pytestmark = pytest.mark.tf_only
TINY = "efficientnet-tiny-g16-lnpn"
CLASSES = 3


def _shifted(model, offset: float) -> list:
    return [w + np.asarray(offset, w.dtype) for w in model.get_weights()]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory written by hand, each weights choice holding other values: the
    checkpoint's raw weights w, its weight average w+1, model.keras w+2, best.keras w+3."""
    root = tmp_path_factory.mktemp("weights") / "run"
    config = TrainConfig(model=TINY, model_dir=str(root))
    keras.utils.set_random_seed(0)
    model = build_model(config, 32, CLASSES)
    raw = model.get_weights()
    CheckpointManager(root / record.CHECKPOINTS).save(
        1, model, state={"config": config.to_dict(), "num_classes": CLASSES},
        average=_shifted(model, 1.0))
    for offset, name in ((2.0, record.MODEL), (3.0, record.BEST_MODEL)):
        model.set_weights([w + np.asarray(offset, w.dtype) for w in raw])
        inference_model(model).save(root / name)
    model.set_weights(raw)
    model.save_weights(root.parent / "raw.weights.h5")
    record.BestRecord(phase="train", epoch=1, val_top1=0.5, weights="the weight average",
                      checkpoint="checkpoints/best").write(root / record.BEST_RECORD)
    record.RunConfig(config=config.to_dict(), num_classes=CLASSES, train_resolution=32,
                     test_resolution=32).write(root / record.CONFIG)
    return root, raw


def _fresh():
    return build_model(TrainConfig(model=TINY), 32, CLASSES)


def _assert_offset(model, raw, offset: float) -> None:
    for got, want in zip(model.get_weights(), raw, strict=True):
        np.testing.assert_allclose(got, want + offset, rtol=0, atol=1e-6)


@pytest.mark.parametrize("choice,offset,kind", [
    ("final", 2.0, "keras"), ("best", 3.0, "keras"), ("average", 1.0, "checkpoint"),
    ("latest", 0.0, "checkpoint")])
def test_a_run_and_each_choice(run, choice, offset, kind):
    root, raw = run
    resolved = weights.resolve(f"{root}:{choice}")
    assert (resolved.kind, resolved.run, resolved.choice) == (kind, root, choice)
    model = _fresh()
    weights.load(resolved, model)
    _assert_offset(model, raw, offset)
    # A run without a choice takes the entry point's default.
    assert weights.resolve(str(root), default=choice) == resolved


def test_files_and_checkpoint_folders(run):
    root, raw = run
    folder = root / record.CHECKPOINTS / "epoch-0001"
    for spec, default, offset, kind in [
            (str(root / record.MODEL), "final", 2.0, "keras"),
            (str(root.parent / "raw.weights.h5"), "final", 0.0, "weights_h5"),
            (str(folder), "average", 1.0, "checkpoint"),
            (str(folder), "latest", 0.0, "checkpoint")]:
        resolved = weights.resolve(spec, default=default)
        assert (resolved.kind, str(resolved.path)) == (kind, spec)
        model = _fresh()
        weights.load(resolved, model)
        _assert_offset(model, raw, offset)
    assert weights.resolve("imagenet") == weights.Weights("imagenet")


def test_a_keras_applications_file_is_told_by_its_layout(tmp_path):
    import h5py

    legacy = tmp_path / "efficientnetb0.h5"
    with h5py.File(legacy, "w") as f:
        f.attrs["layer_names"] = [b"stem_conv"]
    resolved = weights.resolve(str(legacy))
    assert resolved.kind == "h5" and weights.is_keras_applications(resolved)
    (tmp_path / "fake.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(WeightsError, match=r"fake.h5 is not an HDF5 file"):
        weights.resolve(str(tmp_path / "fake.h5"))


def test_the_grammar_refuses_in_one_line(tmp_path, run):
    root, _ = run
    cases = [
        ("none.keras", "--weights='none.keras': no such file or folder; give 'imagenet'"),
        ("x.png", "--weights='x.png': give 'imagenet'"),
        (f"{tmp_path}:best", f"{tmp_path} is not a run directory"),
        (str(tmp_path), "is a folder that is neither a run directory nor a checkpoint"),
    ]
    for spec, words in cases:
        with pytest.raises(WeightsError) as error:
            weights.resolve(spec)
        assert words in str(error.value) and "\n" not in str(error.value), spec


def _damaged_run(run, tmp_path):
    """A copy of the run whose only checkpoint's weights file was changed after writing, and
    without model.keras (so that final falls back to the checkpoints)."""
    root, _ = run
    copy = tmp_path / "damaged-run"
    shutil.copytree(root, copy)
    (copy / record.MODEL).unlink()
    target = copy / record.CHECKPOINTS / "epoch-0001" / record.WEIGHTS
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return copy, copy / record.CHECKPOINTS / "epoch-0001"


def test_a_changed_manifest_digest_and_a_temporary_folder_are_refused(run, tmp_path):
    root, _ = run
    folder = tmp_path / "epoch-0001"
    shutil.copytree(root / record.CHECKPOINTS / "epoch-0001", folder)
    manifest = json.loads((folder / record.MANIFEST).read_text())
    manifest["files"][record.STATE]["sha256"] = "0" * 64
    (folder / record.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(WeightsError, match=r"state.json does not match its SHA-256"):
        weights.resolve(str(folder))
    temporary = tmp_path / ".tmp-epoch-0002-abc"
    shutil.copytree(root / record.CHECKPOINTS / "epoch-0001", temporary)
    with pytest.raises(WeightsError) as error:
        weights.resolve(str(temporary), flag="--init_checkpoint")
    assert str(error.value) == (
        f"--init_checkpoint={str(temporary)!r}: {temporary} is a temporary folder left by an "
        "interrupted save, not a checkpoint; give a complete checkpoint folder or the run "
        "directory")


def _damaged_keras(run, tmp_path):
    """model.keras with one byte of its weights member changed: the zip's directory reads,
    the member's CRC does not hold."""
    root, _ = run
    path = tmp_path / "damaged.keras"
    shutil.copy(root / record.MODEL, path)
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(".h5"))
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _one_line(error, *words) -> None:
    line = str(error)
    assert "\n" not in line and all(w in line for w in words), line


def test_a_damaged_checkpoint_is_refused_from_every_entry_point(run, tmp_path, monkeypatch):
    from keras_efficientnet.models.efficientnet import EfficientNet
    from keras_efficientnet.runs.run import open_run
    from keras_efficientnet.training.evaluation import load_evaluated_weights
    from keras_efficientnet.training.resume import load_weights_for, resume_point
    from keras_efficientnet.training.warm_start import warm_start

    damaged_run, folder = _damaged_run(run, tmp_path)
    reason = "model.weights.h5 does not match its SHA-256 in the manifest"
    base = TrainConfig(model=TINY, model_dir=str(tmp_path / "other"))
    entries = {
        "--init_checkpoint": lambda: load_weights_for(
            base.replace(init_checkpoint=str(folder), mode="finetune"), _fresh()),
        "--mode=evaluate --init_checkpoint": lambda: load_evaluated_weights(
            base.replace(init_checkpoint=str(folder), mode="evaluate"), _fresh()),
        "--weights": lambda: warm_start(_fresh(), base.replace(weights=str(folder))),
        "--mode=evaluate --model_dir": lambda: load_evaluated_weights(
            base.replace(model_dir=str(damaged_run), mode="evaluate",
                         evaluate_weights="latest"), _fresh()),
        "from_preset": lambda: EfficientNet.from_preset(f"{damaged_run}:latest"),
        "open_run": lambda: open_run(damaged_run).models["average"],
        "resume": lambda: resume_point(
            base.replace(model_dir=str(damaged_run)),
            CheckpointManager(damaged_run / record.CHECKPOINTS), CLASSES, chief=False),
    }
    for name, enter in entries.items():
        with pytest.raises(ValueError) as error:
            enter()
        # The file (the resume names the folder within its directory), the reason, the fix.
        _one_line(error.value, str(folder.parent), folder.name, reason)
        assert "backup" in str(error.value), name


def test_a_damaged_model_file_is_refused_by_the_commands(run, tmp_path, capsys):
    from keras_efficientnet.cli import evaluate, export, predict
    from keras_efficientnet.training.evaluation import load_model_file

    path = _damaged_keras(run, tmp_path)
    with pytest.raises(WeightsError) as error:
        weights.resolve(str(path))
    _one_line(error.value, str(path), "give an intact .keras file")
    image = tmp_path / "x.png"
    keras.utils.save_img(image, np.zeros((8, 8, 3), np.uint8))
    for command, argv in ((predict, ["predict", f"--model_file={path}", str(image)]),
                          (evaluate, ["evaluate", f"--model_file={path}"]),
                          (export, ["export", str(path), f"--output={tmp_path / 'out'}"])):
        assert command.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and "intact .keras" in err, err
    with pytest.raises(WeightsError):
        load_model_file(_fresh(), path, TrainConfig(model=TINY))


@pytest.mark.slow
def test_the_commands_take_a_run(run, tmp_path, capsys):
    from keras_efficientnet.cli import predict

    root, _ = run
    image = tmp_path / "x.png"
    keras.utils.save_img(image, np.full((40, 40, 3), 100, np.uint8))
    assert predict.main(["predict", f"--model_file={root}:best", "--top_k=1",
                         str(image)]) == 0
    printed = capsys.readouterr().out.splitlines()
    best = keras.models.load_model(root / record.BEST_MODEL)
    probabilities = predict.predict(best, [str(image)], 32)[0]
    assert printed[0] == str(image)
    assert printed[1].split()[1] == "class" and float(printed[1].split()[-1]) == (
        pytest.approx(probabilities.max(), abs=1e-4))


def test_from_preset_of_a_run_is_its_model(run):
    from keras_efficientnet.models.efficientnet import EfficientNet

    root, raw = run
    model = EfficientNet.from_preset(str(root))  # final: model.keras
    _assert_offset(model, raw, 2.0)
    assert model.output_shape == (None, CLASSES)
    assert model.get_config()["classifier_activation"] == "softmax"
    any_size = EfficientNet.from_preset(f"{root}:average", input_shape=(None, None, 3))
    _assert_offset(any_size, raw, 1.0)
