"""Exit statuses as documented (docs/reliability.md): bad input 2, absl's own flag errors and
unreadable flagfiles included; run failed 1; stopped by signal N 128 + N. Every float flag
refuses NaN and infinities before TensorFlow loads."""

from __future__ import annotations

import dataclasses
import errno
import math
import signal

import pytest

from keras_efficientnet.cli import errors
from keras_efficientnet.training.checkpoint import CheckpointWriteError
from keras_efficientnet.training.config import TrainConfig
from tests.reliability.clitools import assert_one_line, env, run_cli

FLOAT_FIELDS = [f.name for f in dataclasses.fields(TrainConfig) if f.type in (float, "float")]


# (case, extra argv, extra environment, exit status, pattern of the one line printed)
BAD_INPUT_TABLE = [
    ("unknown flag", ["--nosuch=1"], {}, 2, r"^error: Unknown command line flag 'nosuch'"),
    ("missing flagfile", ["--flagfile=/no/such.flags"], {}, 2,
     r"^error: Unable to open flagfile: .*No such file or directory: '/no/such\.flags'"),
    ("integer flag not a number", ["--epochs=abc"], {}, 2, r"^error: flag --epochs=abc: "),
    ("enum flag outside its choices", ["--mode=bogus"], {}, 2,
     r"^error: flag --mode=bogus: value should be one of <train\|evaluate"),
    ("NaN learning rate", ["--learning_rate=nan"], {}, 2,
     r"^error: --learning_rate must be a finite number, received nan$"),
    ("infinite weight decay", ["--weight_decay=-inf"], {}, 2,
     r"^error: --weight_decay must be a finite number, received -inf$"),
    ("positional argument", ["positional"], {}, 2,
     r"^error: unexpected arguments \['positional'\]; every setting is a --flag$"),
    ("KERAS_BACKEND=jax", [], {"KERAS_BACKEND": "jax"}, 2,
     r"^error: the trainer needs TensorFlow but KERAS_BACKEND='jax'; run it with `unset "
     r"KERAS_BACKEND`"),
]


@pytest.mark.parametrize("case,argv,extra,status,pattern", BAD_INPUT_TABLE,
                         ids=[row[0] for row in BAD_INPUT_TABLE])
def test_bad_input_exits_2_in_one_line_before_tensorflow_loads(tmp_path, case, argv, extra,
                                                                status, pattern):
    result = run_cli("--flagfile=flags/smoke.flags", f"--model_dir={tmp_path / 'run'}", *argv,
                     python_options=["-X", "importtime"], env=env(**extra), timeout=120)
    line = assert_one_line(result, status, pattern)
    imported = {row.rsplit("|", 1)[-1].strip() for row in result.stderr.splitlines()
                if row.startswith("import time:")}
    assert not imported & {"tensorflow", "keras", "jax"}, line
    assert not (tmp_path / "run").exists()  # nothing written for bad input
    print(f"{case}: exit {result.returncode}: {line}")


def _link_at_run_lock(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "victim").write_text("precious")
    (tmp_path / "run" / "run.lock").symlink_to(tmp_path / "victim")
    return [], r"^error: .*/run/run\.lock is a symbolic link \(to '.*/victim'\), not a " \
               r"regular file: the lock is never taken through a link; remove it"


def _link_at_checkpoints(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(tmp_path / "other")
    return [], r"^error: .*/run/checkpoints is a symbolic link \(to '.*/other'\): the run " \
               r"writes only into its own directories and never through a link"


def _foreign_export_dir(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_text("x")
    return [f"--export_dir={tmp_path / 'photos'}"], (
        r"^error: --export_dir='.*/photos' is a non-empty directory that is not an export of "
        r"this project \(it holds cat\.jpg\): nothing is merged into it")


@pytest.mark.parametrize("setup", [_link_at_run_lock, _link_at_checkpoints, _foreign_export_dir])
def test_unsafe_paths_exit_2_before_tensorflow_loads(tmp_path, setup):
    argv, pattern = setup(tmp_path)
    result = run_cli("--flagfile=flags/smoke.flags", f"--model_dir={tmp_path / 'run'}", *argv,
                     python_options=["-X", "importtime"], timeout=120)
    line = assert_one_line(result, 2, pattern)
    assert "tensorflow" not in {row.rsplit("|", 1)[-1].strip()
                                for row in result.stderr.splitlines()}
    if setup is _link_at_run_lock:
        assert (tmp_path / "victim").read_text() == "precious"  # not written through
    print(f"{setup.__name__}: exit {result.returncode}: {line}")


def _named(name: str, base=Exception):
    return type(name, (base,), {})


RUN_TABLE = [
    ("NaN loss", _named("NonFiniteLossError", ArithmeticError)("loss became nan at step 3"),
     1, "error: loss became nan at step 3"),
    ("diverged loss", _named("DivergenceError", ArithmeticError)("loss 40.1 > 5 x ln(10)"),
     1, "error: loss 40.1 > 5 x ln(10)"),
    ("checkpoint write refused", CheckpointWriteError(errno.ENOSPC, "could not write x"), 1,
     "error: could not write x"),
    ("results write refused", OSError(errno.ENOSPC, "No space left on device"), 1,
     "error: [Errno 28] No space left on device"),
]


@pytest.mark.parametrize("case,error,status,line", RUN_TABLE, ids=[r[0] for r in RUN_TABLE])
def test_a_run_that_fails_on_its_way_exits_1(case, error, status, line):
    assert errors.describe(error) == (line, status)


@pytest.mark.parametrize("signum,status", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                           (signal.SIGHUP, 129)])
def test_a_signal_exits_128_plus_its_number(signum, status):
    # The subprocess runs that send the signals are in test_cli_slow.py.
    from keras_efficientnet.training.preemption import Preempted

    stopped = Preempted(signum, "runs/x/checkpoints/epoch-0001-batch-000002", 5)
    line, code = errors.describe(stopped)
    assert code == status
    assert line.startswith(f"stopped by {signal.Signals(signum).name} after step 5")


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_flag_refuses_nan_and_infinities(name, value):
    with pytest.raises(ValueError) as raised:
        TrainConfig(**{name: value})
    assert str(raised.value) == f"--{name} must be a finite number, received {value}"


def test_the_float_fields_are_the_float_flags():
    # The check reads the dataclass types; the flags are defined from the same fields.
    from absl import flags

    from keras_efficientnet.cli.flags import define_flags

    values = flags.FlagValues()
    define_flags(values)
    floats = sorted(name for name in values if values[name].flag_type() == "float")
    assert floats == sorted(FLOAT_FIELDS) and len(floats) > 20
