"""Recipes by name: the flagfiles of flags/ (copied into the wheel), `ke.list_recipes()` and the
training command's `--recipe`, whose flags the command line overrides."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import keras_efficientnet as ke
from keras_efficientnet import recipes

REPO = Path(__file__).resolve().parents[1]


def test_list_recipes_is_the_flags_folder():
    on_disk = sorted(p.name.removesuffix(".flags") for p in (REPO / "flags").glob("*.flags"))
    assert list(ke.list_recipes()) == on_disk and {"default", "smoke"} <= set(on_disk)
    assert list(ke.list_recipes("b0-g16-lnpn-*")) == ["b0-g16-lnpn-half", "b0-g16-lnpn-native"]
    assert recipes.recipe_path("smoke") == REPO / "flags" / "smoke.flags"


def test_recipe_becomes_the_first_flagfile():
    smoke = recipes.recipe_path("smoke")
    assert recipes.expand_recipe(["train", "--model_dir=/x", "--recipe=smoke", "--epochs=2"]) == [
        "train", f"--flagfile={smoke}", "--model_dir=/x", "--epochs=2"]
    assert recipes.expand_recipe(["train", "--recipe", "smoke", "--", "--recipe=x"]) == [
        "train", f"--flagfile={smoke}", "--", "--recipe=x"]
    with pytest.raises(ValueError, match=r"--recipe='smok' is not a recipe \(did you mean "
                                         r"'smoke'\?\); recipes: .*default.*smoke"):
        recipes.expand_recipe(["train", "--recipe=smok"])
    with pytest.raises(ValueError, match="--recipe given 2 times"):
        recipes.expand_recipe(["train", "--recipe=smoke", "--recipe=default"])


def test_the_installed_copy_is_preferred(tmp_path, monkeypatch):
    (tmp_path / "only.flags").write_text("--epochs=1\n")
    monkeypatch.setattr(recipes, "PACKAGE_DIR", tmp_path)
    assert recipes.list_recipes() == {"only": ""}  # no opening comment: no description
    monkeypatch.setattr(recipes, "SOURCE_DIR", tmp_path / "none")
    monkeypatch.setattr(recipes, "PACKAGE_DIR", tmp_path / "none")
    with pytest.raises(FileNotFoundError, match="no recipes"):
        recipes.list_recipes()


def _train(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "keras_efficientnet.train", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)
    return done, time.perf_counter() - start


def test_a_recipe_and_its_overrides_from_another_directory(tmp_path):
    # --mode=finetune without a checkpoint is refused before any work; the message shows the
    # recipe was read (its model) and the command line won (its model_dir and mode).
    done, seconds = _train("--mode=finetune", "--recipe=smoke", f"--model_dir={tmp_path}/r",
                           cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert f"{tmp_path}/r" in done.stderr
    done, seconds = _train("--recipe=nope", cwd=tmp_path)
    assert (done.returncode, done.stderr.count("\n")) == (2, 1)
    assert done.stderr.startswith("error: --recipe='nope' is not a recipe")
    assert seconds < 5, seconds  # before TensorFlow


def test_a_digits_recipe_on_photos_names_what_carries_over_and_the_photos_recipe():
    warning = recipes.dataset_mismatch("default", "folder:photos")
    # default.flags, read by hand: digits at 64 px, tested at 96, no flips, the tiny model.
    assert warning == (
        "--recipe=default is tuned for --dataset=digits (--model=efficientnet-tiny-g16-lnpn "
        "--train_resolution=64 --test_resolution=96 --norandom_flip), which carry over to "
        "--dataset=folder:photos; for photos use --recipe=finetune-photos")
    assert recipes.dataset_mismatch("default", "digits") is None
    assert recipes.dataset_mismatch("smoke", "synthetic") is None  # built-in to built-in
    assert recipes.dataset_mismatch("finetune-photos", "folder:photos") is None
    assert recipes.dataset_mismatch("b0-g16-lnpn-half", "tfrecord:/data/x") is None
    assert recipes.dataset_mismatch("smoke", "tfrecord:/data/x") is None  # a quick check's data
    assert recipes.recipe_names(["train", "--recipe", "smoke", "--epochs=1"]) == ["smoke"]


def test_the_photos_recipe_trains_at_the_model_resolution_with_flips_and_keeps_the_best():
    from absl import flags

    from keras_efficientnet.cli.flags import config_from_flags, define_flags
    from keras_efficientnet.training.config import resolved_resolutions

    values = flags.FlagValues()
    define_flags(values)
    values(["prog", f"--flagfile={recipes.recipe_path('finetune-photos')}"])
    config = config_from_flags(values)
    assert (config.model, config.weights) == ("efficientnet-b0-g1-bn", "imagenet")
    assert resolved_resolutions(config) == (224, 224)  # B0's own, train and test
    assert config.random_flip and config.crop_area_min == 0.25 and config.mode == "train"
    assert config.eval_every == 1 and config.weight_average_decay == 0  # best.keras per epoch
    assert config.epochs <= 10
    # Another preset takes its own weights (ImageNet's fit G1-BN only: refused before TF).
    values(["prog", "--model=efficientnet-tiny-g16-lnpn", "--weights="])
    assert resolved_resolutions(config_from_flags(values)) == (64, 64)


def test_a_digits_recipe_on_a_folder_warns_in_one_line_before_tensorflow(tmp_path):
    (tmp_path / "photos" / "train" / "cat").mkdir(parents=True)
    done, seconds = _train("--recipe=smoke", "--dataset=folder:photos", "--mode=evaluate",
                           f"--model_dir={tmp_path}/none", cwd=tmp_path)
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: --recipe=smoke is tuned for --dataset=digits (--model=efficientnet-tiny-g16-"
        "lnpn --train_resolution=32 --test_resolution=64 --norandom_flip), which carry over "
        "to --dataset=folder:photos; for photos use --recipe=finetune-photos"], done.stderr
    # ... and the folder's missing held-out split is the one error, naming both fixes.
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "val/ or valid/" in errors[0], done.stderr
    assert "--validation_split=0.1" in errors[0] and "Traceback" not in done.stderr
