"""GroupConv2D and a G16 training step with oneDNN off and on, whatever this CPU defaults to.

TensorFlow leaves oneDNN off on AVX2-only x86 CPUs, and without it a grouped `tf.nn.conv2d` has
no gradient on CPU; `GroupConv2D` probes for that gradient and uses per-group convolutions where
it is missing. TensorFlow reads the variable once, at import: the setting this process started
with runs here, the other in a process of its own (each a fresh one when this process's setting
is neither), and both must agree with the NumPy reference and with each other.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.layers.test_group_conv import reference_conv, reference_grads

pytestmark = pytest.mark.tf_only
ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ("0", "1")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{setting: (report, arrays)}; a started process runs beside this one's setting."""
    tmp = tmp_path_factory.mktemp("onednn")
    # Only TensorFlow's own process reads the variable it imported with; the subprocess for the
    # other setting saves one `import tensorflow` and start-up (about 5 CPU seconds).
    own = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    procs = {}
    for setting in SETTINGS:
        if setting == own:
            continue
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "3",
               "KERAS_BACKEND": "tensorflow", "CUDA_VISIBLE_DEVICES": ""}
        procs[setting] = subprocess.Popen(
            [sys.executable, "-m", "tests.layers.onednn_paths_script",
             str(tmp / f"onednn{setting}.npz")],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    if own in SETTINGS:
        from tests.layers import onednn_paths_script

        # Through JSON, as the other process's report comes (tuples become lists).
        report = json.loads(json.dumps(onednn_paths_script.run(str(tmp / f"onednn{own}.npz"))))
        results[own] = report, dict(np.load(tmp / f"onednn{own}.npz"))
    for setting, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"TF_ENABLE_ONEDNN_OPTS={setting}: no result in 300 s")
        assert proc.returncode == 0, f"TF_ENABLE_ONEDNN_OPTS={setting} failed:\n{err[-3000:]}"
        report = json.loads(out.strip().splitlines()[-1])
        results[setting] = report, dict(np.load(tmp / f"onednn{setting}.npz"))
    return results


def test_each_setting_takes_the_path_its_tensorflow_can_differentiate(runs):
    off, _ = runs["0"]
    on, _ = runs["1"]
    groups = [channels // group_size for channels, _, group_size, _, _ in off["cases"]]
    # Without oneDNN the CPU has no grouped-conv gradient: every case is per-group.
    assert off["grouped_gradient"] is False
    assert off["paths"] == ["per_group"] * len(groups)
    if platform.machine() in ("x86_64", "AMD64"):
        # oneDNN (forced on) differentiates the grouped kernel on every x86-64 CPU.
        assert on["grouped_gradient"] is True
    expected = ["grouped" if on["grouped_gradient"] and g > 10 else "per_group" for g in groups]
    assert on["paths"] == expected


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_environment_says_whether_onednn_was_on(runs, setting):
    # What results.json and every benchmark row record: TensorFlow's own answer, which the
    # variable set explicitly decides on any CPU.
    environment = runs[setting][0]["environment"]
    assert environment["onednn"] is (setting == "1")
    assert environment["backend"] == "tensorflow"
    assert environment["tensorflow"].startswith("2.") and environment["cores"] >= 1


@pytest.mark.parametrize("setting", SETTINGS)
def test_forward_and_gradients_match_numpy(runs, setting):
    report, arrays = runs[setting]
    for i, (_, _, _, _, strides) in enumerate(report["cases"]):
        x, kernel, upstream = arrays[f"{i}_x"], arrays[f"{i}_kernel"], arrays[f"{i}_upstream"]
        expected = reference_conv(x, kernel, strides, "same")
        ref_dx, ref_dk = reference_grads(x, kernel, upstream, strides, "same")
        where = f"TF_ENABLE_ONEDNN_OPTS={setting}, case {report['cases'][i]}"
        np.testing.assert_allclose(arrays[f"{i}_y"], expected, rtol=1e-4, atol=1e-3,
                                   err_msg=where)
        np.testing.assert_allclose(arrays[f"{i}_dx"], ref_dx, rtol=1e-4, atol=1e-3,
                                   err_msg=where)
        np.testing.assert_allclose(arrays[f"{i}_dk"], ref_dk, rtol=1e-4, atol=1e-3,
                                   err_msg=where)


def test_g16_training_step_agrees_between_settings(runs):
    (off, off_arrays), (on, on_arrays) = runs["0"], runs["1"]
    assert np.isfinite(off["loss"]) and np.isfinite(on["loss"])
    # Same seed, data and step: only the kernels' summation order differs.
    np.testing.assert_allclose(off["loss"], on["loss"], rtol=1e-4)
    assert off_arrays["weights"].shape == on_arrays["weights"].shape
    np.testing.assert_allclose(off_arrays["weights"], on_arrays["weights"], rtol=1e-3, atol=1e-5)
    # The step moved the weights: an agreement of two untrained models would prove nothing.
    # Both settings started from the same weights (the same seed), and the step left them.
    np.testing.assert_array_equal(off_arrays["initial"], on_arrays["initial"])
    assert np.abs(off_arrays["weights"] - off_arrays["initial"]).max() > 1e-4
