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
    assert ke.list_recipes() == on_disk and {"default", "smoke"} <= set(on_disk)
    assert ke.list_recipes("b0-g16-lnpn-*") == ["b0-g16-lnpn-half", "b0-g16-lnpn-native"]
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
    assert recipes.list_recipes() == ["only"]
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
