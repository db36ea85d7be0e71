"""`train --help`: the project's flags by group with their defaults, absl's own only under
--helpfull; TensorFlow's start-up lines only when --verbosity asks."""

import os
import subprocess
import sys
from pathlib import Path

from keras_efficientnet.cli import help as cli_help
from keras_efficientnet.cli import quiet

REPO = Path(__file__).resolve().parents[2]
GROUPS = ["recipe", "model", "data", "optimization", "schedule", "run directory",
          "execution plan", "export"]


def _train(*args, env=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return subprocess.run([sys.executable, "-m", "keras_efficientnet.train", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_help_lists_the_project_flags_by_group_with_defaults():
    done = _train("--help")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    lines = done.stdout.splitlines()
    titles = [line[:-1] for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert titles == [*GROUPS, "exit status"]  # every group, in order, no "other", the table
    section = lines[lines.index("model:"):lines.index("data:")]
    assert "  --model  (default: 'efficientnet-b0-g16-lnpn')" in section
    assert "  --micro_batch_size  (default: 32)" in lines[lines.index("execution plan:"):]
    assert "  --export_dir  (default: '')" in lines[lines.index("export:"):]
    for absl_flag in ("logtostderr", "run_with_pdb", "only_check_args", "--v "):
        assert absl_flag not in done.stdout
    full = _train("--helpfull")
    assert full.returncode == 0 and "--[no]logtostderr" in full.stdout


def test_every_config_field_has_a_group():
    from keras_efficientnet.cli.train import project_flag_names

    grouped = cli_help.project_flags(project_flag_names(), __import__("absl").flags.FLAGS)
    assert cli_help.OTHER not in grouped, (
        f"add {grouped.get(cli_help.OTHER)} to a group of keras_efficientnet/cli/help.py")


def test_native_stderr_is_silenced_only_inside_the_block():
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); "
            "import importlib.util as u; spec = u.spec_from_file_location('q', sys.argv[2]); "
            "q = u.module_from_spec(spec); spec.loader.exec_module(q)\n"
            "with q.native_stderr_silenced(): os.write(2, b'hidden\\n')\n"
            "with q.native_stderr_silenced(False): os.write(2, b'shown\\n')\n"
            "os.write(2, b'after\\n')")
    done = subprocess.run([sys.executable, "-c", code, str(REPO), quiet.__file__],
                          capture_output=True, text=True, timeout=60)
    assert done.stderr == "shown\nafter\n"


def test_tensorflow_start_up_lines_only_with_verbosity(tmp_path):
    # oneDNN forced on prints its start-up notice from C++ on every CPU; a missing TFRecord
    # source fails with one line right after TensorFlow has loaded.
    args = ["--recipe=smoke", f"--model_dir={tmp_path}/run", f"--dataset=tfrecord:{tmp_path}/x-*"]
    quiet_run = _train(*args, env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    assert quiet_run.returncode == 2
    assert quiet_run.stderr.startswith("error: no TFRecord files match"), quiet_run.stderr
    assert quiet_run.stderr.count("\n") == 1, quiet_run.stderr
    loud = _train(*args, f"--model_dir={tmp_path}/run2", "--verbosity=0",
                  env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    assert loud.returncode == 2 and "oneDNN custom operations are on" in loud.stderr
