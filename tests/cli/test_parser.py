"""The commands' one room (issue 34 point 2): one parser module, one BadInput, one exit-status
table, one spelling per flag, and the old spellings as deprecated aliases that warn once."""

import ast
import configparser
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keras_efficientnet.cli import errors, evaluate, export, folder_to_tfrecord, predict, train
from keras_efficientnet.cli.parser import CommandParser, renamed_flags

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "keras_efficientnet" / "cli"
COMMANDS = {"train": train, "evaluate": evaluate, "predict": predict, "export": export,
            "folder_to_tfrecord": folder_to_tfrecord}


def test_a_usage_error_is_bad_input_in_one_line():
    parser = CommandParser("keras-efficientnet-x", "What x does.\n\nMore.")
    parser.add_argument("--batch_size", type=int, default=1)
    with pytest.raises(errors.BadInput) as raised:
        parser.parse_args(["--batch_size=two"])
    assert str(raised.value) == ("argument --batch_size: invalid int value: 'two' (see --help)")
    assert isinstance(raised.value, ValueError)  # what train's error table reads as bad input
    assert parser.description == "What x does."


def test_old_spellings_are_renamed_with_one_warning_each(capsys):
    args = evaluate.build_parser().parse_args(
        ["--model=m.keras", "--split", "test", "--model=n.keras"])
    assert (args.model_file, args.eval_split) == ("n.keras", "test")
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        "warning: keras-efficientnet-evaluate --model is deprecated and goes in the next "
        "release; use --model_file (the same value): --model names an architecture preset in "
        "every command",
        "warning: keras-efficientnet-evaluate --split is deprecated and goes in the next "
        "release; use --eval_split (the same value): the held-out split is --eval_split in "
        "every command"]
    # The new spellings warn about nothing; `--` ends the renaming.
    args = predict.build_parser().parse_args(["--model_file=m.keras", "x.png"])
    assert args.model_file == "m.keras" and capsys.readouterr().err == ""
    assert renamed_flags(["--model=a", "--", "--model=b"], {"model": ("model_file", "")},
                         "p") == ["--model_file=a", "--", "--model=b"]
    capsys.readouterr()


def test_the_deprecated_alias_still_reaches_the_command(tmp_path):
    # No TensorFlow: a stand-in package that fails to import proves the check runs before it.
    stand_in = tmp_path / "no_tf" / "tensorflow"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise ImportError('TensorFlow was imported')\n")
    (tmp_path / "fake.keras").write_text("no zip")
    env = dict(os.environ, PYTHONPATH=f"{stand_in.parent}{os.pathsep}{REPO}")
    for argv in (["keras_efficientnet.evaluate", f"--model={tmp_path}/fake.keras"],
                 ["keras_efficientnet.predict", f"--model={tmp_path}/fake.keras", "x.png"]):
        done = subprocess.run([sys.executable, "-m", *argv], env=env, capture_output=True,
                              text=True, timeout=60)
        lines = done.stderr.splitlines()
        assert done.returncode == errors.BAD_INPUT, done.stderr
        assert lines[0].startswith("warning: keras-efficientnet-") and "use --model_file" in (
            lines[0])
        assert lines[1:] == [f"error: {tmp_path}/fake.keras: not a Keras model file (a .keras "
                             "file is a zip archive with a config.json; this one is not)"]


def test_one_exit_status_table():
    assert errors.EXIT_STATUSES.keys() == {0, 1, 2, 128 + signal.SIGINT, 128 + signal.SIGTERM}
    assert (errors.DONE, errors.RUN_FAILED, errors.BAD_INPUT) == (0, 1, 2)
    assert {128 + signal.SIGINT, 128 + signal.SIGTERM} == {130, 143}
    table = errors.exit_status_help()
    flat = " ".join(table.split())
    for code, text in errors.EXIT_STATUSES.items():
        assert f" {code} {' '.join(text.split())}" in flat
    # Every command's --help ends with it (argparse wraps nothing: the epilog is raw).
    for name, module in COMMANDS.items():
        if name == "train":
            from keras_efficientnet.cli.help import grouped_help

            shown = " ".join(grouped_help(train.project_flag_names()).split())
        else:
            shown = " ".join(module.build_parser().format_help().split())
        assert shown.endswith(" ".join(table.split())), name


def _tree(name: str) -> ast.Module:
    return ast.parse((CLI / f"{name}.py").read_text())


def test_the_commands_share_one_parser_module():
    for name in COMMANDS:
        tree = _tree(name)
        imports = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "keras_efficientnet.cli.parser" in imports, name
        # No parser class, BadInput or exit-status constant of its own ...
        classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
        assert not classes & {"BadInput", "_Parser", "CommandParser"}, name
        constants = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     for target in node.targets if isinstance(target, ast.Name)}
        assert not constants & {"BAD_INPUT", "FAILED", "RUN_FAILED", "DONE"}, name
        # ... nor an argparse parser built by hand, nor an exit status written as a number.
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
        assert not any(ast.unparse(c.func) == "argparse.ArgumentParser" for c in calls), name
        assert not any(ast.unparse(c.func) == "sys.exit" and c.args and isinstance(
            c.args[0], ast.Constant) and c.args[0].value != 0 for c in calls), name
        # One `main(argv) -> int` and `run()` each.
        functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert {"main", "run"} <= functions, name
    assert {p.stem for p in CLI.glob("*.py")} - set(COMMANDS) == {
        "__init__", "errors", "flags", "help", "parser", "quiet", "summary"}


def test_console_scripts_and_old_module_paths_reach_the_room():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    scripts = dict(line.split(" = ") for line in
                   config["options.entry_points"]["console_scripts"].strip().splitlines())
    assert scripts == {f"keras-efficientnet-{name.replace('_', '-')}":
                       f"keras_efficientnet.cli.{name}:run" for name in COMMANDS}
    import importlib

    for name in ("train", "evaluate", "predict", "folder_to_tfrecord"):  # kept forwarders
        old = importlib.import_module(f"keras_efficientnet.{name}")
        assert (old.main, old.run) == (COMMANDS[name].main, COMMANDS[name].run)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_answers_help_and_usage_errors_before_tensorflow(tmp_path, name):
    stand_in = tmp_path / "no_tf" / "tensorflow"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise ImportError('TensorFlow was imported')\n")
    env = dict(os.environ, PYTHONPATH=f"{stand_in.parent}{os.pathsep}{REPO}")

    def command(*args):
        return subprocess.run([sys.executable, "-m", f"keras_efficientnet.cli.{name}", *args],
                              env=env, capture_output=True, text=True, timeout=120)

    shown = command("--help")
    assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
    assert " ".join(shown.stdout.split()).endswith(" ".join(errors.exit_status_help().split()))
    required = {"export": [str(tmp_path)],
                "folder_to_tfrecord": ["--input_dir=a", "--output_dir=b"]}
    refused = command(*required.get(name, []), "--no_such_flag=1")
    assert refused.returncode == errors.BAD_INPUT and refused.stdout == "", refused.stderr
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: ")
    assert "no_such_flag" in refused.stderr
    if name == "folder_to_tfrecord":  # its input check comes before TensorFlow too
        missing = command(f"--input_dir={tmp_path / 'nope'}", f"--output_dir={tmp_path}/out")
        assert (missing.returncode, missing.stderr) == (
            errors.BAD_INPUT, f"error: input_dir {str(tmp_path / 'nope')!r} does not exist\n")
