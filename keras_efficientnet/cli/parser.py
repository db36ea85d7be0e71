"""The commands' one parser convention, shared by train (absl flags, for its flagfiles and
recipes) and evaluate, predict, export and folder_to_tfrecord (argparse):

- `main(argv) -> int` takes `sys.argv`'s shape (the program name first) and returns an exit
  status of `errors.EXIT_STATUSES`; `run()`, the console script, is `sys.exit(main(sys.argv))`.
- Flag spellings agree across commands: `--model` is an architecture preset (train), a model file
  is `--model_file` (or the positional SOURCE of export), the held-out split is `--eval_split`.
- Usage errors are one `error:` line and exit status 2, never argparse's usage block; `--help`
  ends with the exit-status table.
- A flag renamed for that agreement keeps its old spelling for one release: it still works and
  prints one `warning:` line naming the new one (`DEPRECATED_FLAGS`).
- Everything checkable is checked before TensorFlow loads.
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from keras_efficientnet.atomic import open_file
from keras_efficientnet.cli.errors import BAD_INPUT, BadInput, exit_status_help, one_line
from keras_efficientnet.runs import record, weights

HELP_FLAGS = ("--help", "-help", "--h", "-h", "-?", "--?")
# Old spelling -> (new spelling, why it changed), per command; each old one goes in the release
# after the one that renamed it.
_PRESET = "--model names an architecture preset in every command"
_SPLIT = "the held-out split is --eval_split in every command"
DEPRECATED_FLAGS: dict[str, dict[str, tuple[str, str]]] = {
    "keras-efficientnet-evaluate": {"model": ("model_file", _PRESET),
                                    "split": ("eval_split", _SPLIT)},
    "keras-efficientnet-predict": {"model": ("model_file", _PRESET)},
}
MODEL_FILE_FLAG = "--model_file"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown beside each flag; the description and the exit-status epilog as written."""


class CommandParser(argparse.ArgumentParser):
    """argparse under the commands' convention: a usage error raises BadInput (one line, exit
    status 2) instead of printing usage and exiting, deprecated spellings of `prog`'s flags are
    renamed with one warning line, and --help ends with the exit-status table.

    Example:
      >>> parser = CommandParser("keras-efficientnet-evaluate", __doc__)
      >>> parser.add_argument("--model_file", help="a .keras model file")
      >>> args = parser.parse_args(["--model=m.keras"])  # warning: --model is deprecated ...
    """

    def __init__(self, prog: str, doc: str, **kwargs):
        super().__init__(prog=prog, description=doc.split("\n\n")[0],
                         epilog=exit_status_help(), formatter_class=_Formatter, **kwargs)
        self.deprecated = DEPRECATED_FLAGS.get(prog, {})

    def error(self, message):  # argparse prints usage and exits 2; one line instead
        raise BadInput(f"{message} (see --help)")

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_args(renamed_flags(args, self.deprecated, self.prog), namespace)


def renamed_flags(args: Sequence[str], deprecated: dict[str, tuple[str, str]],
                  prog: str) -> list[str]:
    """`args` with each deprecated flag (`--old` or `--old=value`) under its new name; one
    `warning:` line on stderr per old name used. Nothing after `--` is touched."""
    out, warned = [], set()
    for position, arg in enumerate(args):
        if arg == "--":
            return out + list(args[position:])
        name, equals, value = arg.partition("=")
        old = name[2:] if name.startswith("--") else ""
        if old not in deprecated:
            out.append(arg)
            continue
        new, why = deprecated[old]
        if old not in warned:
            warned.add(old)
            print(f"warning: {prog} --{old} is deprecated and goes in the next release; use "
                  f"--{new} (the same value): {why}", file=sys.stderr, flush=True)
        out.append(f"--{new}{equals}{value}")
    return out


def command_status(body: Callable[[list[str]], int], argv: list[str],
                   unfinished: str = "the command did not finish; run it again") -> int:
    """`body(argv)`'s exit status under the convention: BadInput is one `error:` line and
    BAD_INPUT; --help (argparse's SystemExit) returns its status instead of exiting; SIGTERM
    or SIGINT anywhere in it (a Keras layer call included) is one `stopped by SIGTERM:
    <unfinished>` line and SIGNAL_BASE + the signal (143, 130)."""
    from keras_efficientnet.training.preemption import Preempted, SignalWatch

    try:
        with SignalWatch():
            return body(argv)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return BAD_INPUT
    except SystemExit as done:
        return int(done.code or 0)
    except Preempted as stopped:
        print(f"stopped by {stopped.signal_name}: {unfinished}", file=sys.stderr, flush=True)
        return stopped.exit_code


def run_command(main: Callable[[list[str]], int]) -> None:
    """A console script's body: the process exits with `main(sys.argv)`'s status, without the
    interpreter's last garbage collection (`quiet.leave_without_collecting`: seconds)."""
    from keras_efficientnet.cli import quiet

    status = main(sys.argv)
    quiet.leave_without_collecting()
    sys.exit(status)


def parse_absl_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing (train's `app.run` `flags_parser`) under the convention: an unknown
    flag, a value of the wrong type, a flagfile that cannot be read are one line, exit 2."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        line = one_line(error).removeprefix("ERROR:: ")  # absl's prefix of flagfile errors
        print(f"error: {line} (--helpfull lists every flag)", file=sys.stderr, flush=True)
        sys.exit(BAD_INPUT)


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    """`--verbosity`, as every argparse command takes it."""
    parser.add_argument("--verbosity", type=int, default=0, help="1 shows TensorFlow's "
                        "start-up lines (quiet by default)")


def model_file(spec: str | None, flag: str = MODEL_FILE_FLAG) -> str | None:
    """The `.keras` file `spec` names: a run `RUN[:final|best]` resolves to its model file
    (`runs.weights`; a bare run: its final model.keras); anything else is the file itself."""
    if not spec or not Path(weights.split_choice(spec)[0]).is_dir():
        return spec
    try:
        resolved = weights.resolve(spec, flag=flag)
    except weights.WeightsError as error:
        raise BadInput(str(error)) from None
    if resolved.kind != "keras":
        raise BadInput(f"{flag}={spec!r} resolves to {resolved.describe()}, which holds no "
                       "model; give a .keras file or RUN[:final|best]")
    return str(resolved.path)


def check_model_file(path: str | None, flag: str = MODEL_FILE_FLAG) -> dict:
    """The Keras config stored in a `.keras` file; BadInput naming `flag` unless it is an
    intact Keras zip (`runs.weights` checks every member's CRC) of a model with a classifier
    head (as far as the stored config tells)."""
    if not path:
        raise BadInput(f"{flag} is required: a .keras file, e.g. "
                       f"{flag}=runs/default/model.keras")
    if not Path(path).is_file():
        raise BadInput(f"{flag}={path!r}: no such file")
    if Path(path).suffix != ".keras":
        raise BadInput(f"{flag}={path!r} is not a .keras file (what training writes, e.g. "
                       "runs/NAME/model.keras)")
    try:
        with open_file(path, "rb", links=True) as f, zipfile.ZipFile(f) as archive:
            config = json.loads(archive.read(record.KERAS_ARCHIVE_CONFIG))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, OSError, ValueError):
        raise BadInput(f"{path}: not a Keras model file (a .keras file is a zip archive with a "
                       "config.json; this one is not)") from None
    inner = config.get("config", {}) if isinstance(config, dict) else {}
    if inner.get("include_top") is False:
        raise BadInput(f"{path}: no classifier head (built with include_top=False, it outputs "
                       "features); a command needs a model that outputs class scores")
    try:
        weights.resolve(path, named=f"{flag}={path!r}")
    except weights.WeightsError as error:
        raise BadInput(str(error)) from None
    return config
