"""The training command's first hour (issue 35): the bare command runs the default recipe,
recipes are browsable (`--recipe=list`, `--show`), a misfit `--weights=imagenet` is refused
before TensorFlow loads, and a run's output is plain lines for people."""

import dataclasses
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags

import keras_efficientnet as ke
from keras_efficientnet.cli import quiet, train
from keras_efficientnet.cli.flags import config_from_flags

REPO = Path(__file__).resolve().parents[2]
FLAGS_DIR = REPO / "flags"
# absl's prefix: severity, date, time, thread id, file:line]
ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]")


def _command(*args, cwd, timeout=120, importtime=False):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    python = [sys.executable, *(["-X", "importtime"] if importtime else [])]
    return subprocess.run([*python, "-m", "keras_efficientnet.train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _parsed_config(argv):
    try:
        train.parse_command_line(argv)
        return config_from_flags(flags.FLAGS)
    finally:
        flags.FLAGS.unparse_flags()


def test_the_bare_command_is_make_trains_job():
    # `make train` runs flags/default.flags; the bare command must build the same config.
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^train:.*\n\t.*--flagfile=flags/default\.flags", makefile, re.M)
    bare = _parsed_config(["train"])
    made = _parsed_config(["train", f"--flagfile={FLAGS_DIR / 'default.flags'}"])
    assert bare == made
    assert (bare.model, bare.dataset, bare.train_resolution) == (
        "efficientnet-tiny-g16-lnpn", "digits", 64)
    # Flags given override the default recipe's; a recipe or flagfile given replaces it.
    assert _parsed_config(["train", "--epochs=3"]) == dataclasses.replace(made, epochs=3)
    smoke = _parsed_config(["train", "--recipe=smoke"])
    assert (smoke.model_dir, smoke.epochs) == ("runs/smoke", 1)


def test_the_default_recipe_goes_first_unless_a_recipe_flagfile_or_evaluation_is_given():
    default = [f"--flagfile={ke.recipes.recipe_path('default')}", "--recipe=default"]
    assert train.with_default_recipe(["train"]) == ["train", *default]
    assert train.with_default_recipe(["train", "--epochs=2", "--", "x"]) == [
        "train", *default, "--epochs=2", "--", "x"]
    for argv in (["train", "--flagfile=f.flags"], ["train", "--mode=evaluate"],
                 ["train", "--mode", "evaluate", "--model_dir=r"]):
        assert train.with_default_recipe(argv) == argv
    # The run says which recipe it chose; a recipe named by the user needs no such line.
    try:
        train.parse_command_line(["train"])
        assert train.recipe_line(flags.FLAGS).startswith("recipe: default (no --recipe or")
    finally:
        flags.FLAGS.unparse_flags()
    try:
        train.parse_command_line(["train", "--recipe=default"])
        assert train.recipe_line(flags.FLAGS) is None
    finally:
        flags.FLAGS.unparse_flags()
    # An expensive preset runs only when named: the bare defaults train the tiny model.
    assert "--model=efficientnet-tiny-g16-lnpn" in ke.recipes.file_flags(
        ke.recipes.recipe_path("default"))


def test_recipes_list_with_their_descriptions(tmp_path):
    on_disk = sorted(p.stem for p in FLAGS_DIR.glob("*.flags"))
    described = ke.list_recipes()
    assert list(described) == on_disk
    # The first sentence of each flagfile's opening comment (written by hand here).
    assert described["smoke"] == ("Smoke run: seconds on a CPU, every phase once (train at "
                                  "32px, average, fine-tune at 64px, evaluate).")
    assert described["b0-g16-lnpn-half"] == (
        "EfficientNet-B0 G16 (16 channels per group, expand 4) with LayerNorm + Proxy Norm on "
        "ImageNet, trained at 160px (about half the pixels), then its head fine-tuned 2 epochs "
        "at 224px.")
    assert all(text and "\n" not in text for text in described.values())
    assert list(ke.list_recipes("b0-g16-lnpn-*")) == ["b0-g16-lnpn-half", "b0-g16-lnpn-native"]

    done = _command("--recipe=list", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    for name, text in described.items():
        assert any(re.fullmatch(rf"{re.escape(name)} +{re.escape(text)}", line)
                   for line in lines), name
    assert lines[-1].startswith(f"{len(on_disk)} recipes;")


def test_show_prints_the_flags_a_recipe_sets(tmp_path):
    smoke = FLAGS_DIR / "smoke.flags"
    expected = [line for line in smoke.read_text().splitlines() if not line.startswith("#")]
    done = _command("--recipe=smoke", "--show", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [f"# {smoke}", *expected]
    assert "--epochs=1" in expected and "--eval_steps=2" in expected
    done = _command("--show", cwd=tmp_path)  # the bare command's recipe
    assert done.returncode == 0 and done.stdout.startswith(f"# {FLAGS_DIR / 'default.flags'}")


def test_imagenet_weights_for_a_g16_preset_are_refused_before_tensorflow(tmp_path):
    done = _command("--model=efficientnet-b0-g16-lnpn", "--weights=imagenet",
                    f"--model_dir={tmp_path / 'run'}", cwd=tmp_path, importtime=True)
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert errors[0].startswith("error: --weights=imagenet does not fit "
                                "--model=efficientnet-b0-g16-lnpn: ")
    assert "group_size=16" in errors[0] and "Fitting preset: efficientnet-b0-g1-bn" in errors[0]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert not imported & {"tensorflow", "keras"}
    assert not (tmp_path / "run").exists()


def test_log_records_print_as_plain_lines():
    formatter = quiet.PlainFormatter()

    def line(level, message, *args):
        record = logging.LogRecord("keras_efficientnet", level, "validation.py", 119, message,
                                   args, None)
        return formatter.format(record)

    assert line(logging.INFO, "best validation top-1 so far (%.4f, epoch %d)", 0.5, 2) == (
        "best validation top-1 so far (0.5000, epoch 2)")
    assert line(logging.WARNING, "took over %s", "runs/x") == "warning: took over runs/x"
    assert line(logging.ERROR, "boom") == "error: boom"


@pytest.mark.slow  # the smoke recipe end to end (about 60-100 s on 2 loaded cores)
def test_a_run_written_to_a_pipe_reads_as_plain_lines(tmp_path):
    done = _command("--recipe=smoke", f"--model_dir={tmp_path / 'run'}", cwd=tmp_path,
                    timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    lines = output.splitlines()
    assert lines[0] == (f"loading: TensorFlow, then efficientnet-tiny-g16-lnpn on digits "
                        f"(--mode=train_and_finetune, --model_dir={tmp_path / 'run'})")
    assert not [line for line in lines if ABSL_PREFIX.match(line)]
    assert "\r" not in output  # one line per epoch, no progress-bar frames
    assert "retracing" not in output
    assert "Unknown" not in output and "ran out of data" not in output
    assert re.search(r"^  trained +1 epoch at 32px, ", done.stdout, re.M)
    assert re.search(r"^  fine-tuned +1 epoch, head only", done.stdout, re.M)
    # The digits' validation split: 355 of their 1797 images.
    assert re.search(r"^  top-1 +0\.\d{4} on 32 of 355 validation images \(--eval_steps=2\)$",
                     done.stdout, re.M), done.stdout


def test_the_config_check_knows_which_presets_imagenet_weights_fit():
    from keras_efficientnet.training.config import TrainConfig

    TrainConfig(model="efficientnet-b0-g1-bn", weights="imagenet")  # keras.applications' B0
    for preset, differs in (("efficientnet-b0-g16-gn", "group_size=16"),
                            ("efficientnet-b0-g1-gn", "norm='group'"),
                            ("efficientnet-tiny-g1-bn", "variant='tiny'")):
        with pytest.raises(ValueError, match=rf"--weights=imagenet does not fit "
                                             rf"--model={preset}: .*{re.escape(differs)}"):
            TrainConfig(model=preset, weights="imagenet")
