"""The execution plan from command-line flags: fields, printed plan, and errors before work."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from absl import flags

from keras_efficientnet.cli.flags import config_from_flags, define_flags
from keras_efficientnet.distribute import run, runtime_for
from keras_efficientnet.distribute.mirrored import MirroredRuntime
from keras_efficientnet.training import TrainConfig, trainer

REPO = Path(__file__).resolve().parents[2]


def _config(*argv):
    values = flags.FlagValues()
    define_flags(values)
    values(["prog", *argv])
    return config_from_flags(values)


def test_flags_build_the_plan_and_its_global_batch():
    config = _config("--strategy=mirrored", "--replicas=2", "--micro_batch_size=8",
                     "--device_iterations=3", "--precision=mixed_bfloat16")
    runtime = runtime_for(config)
    assert isinstance(runtime, MirroredRuntime)
    p = runtime.plan
    assert p is config.plan  # built once, by the config
    assert (p.strategy, p.replicas, p.micro_batch_size, p.device_iterations, p.precision) == (
        "mirrored", 2, 8, 3, "mixed_bfloat16")
    assert p.global_batch_size == config.global_batch_size == 16
    assert "16 = 8 x 1 x 2 (micro-batch x accumulation x replicas)" in p.describe()
    # The learning rate scales with the global batch: 2^-14 per example x 16.
    assert config.peak_learning_rate() == pytest.approx(16 * 2 ** -14)

    piped = _config("--pipeline_splits=block2a,block4a", "--micro_batch_size=4",
                    "--gradient_accumulation=6").plan
    assert (piped.pipeline_splits, piped.num_stages, piped.global_batch_size) == (
        ("block2a", "block4a"), 3, 24)
    auto = _config("--pipeline_splits=auto:2").plan
    assert (auto.auto_stages, auto.pipeline_splits) == (2, ())


def test_global_batch_flag_derives_the_accumulation():
    config = _config("--global_batch_size=96", "--micro_batch_size=4", "--replicas=1")
    assert (config.gradient_accumulation, config.global_batch_size) == (24, 96)
    with pytest.raises(ValueError, match=r"global_batch_size=100 must be a multiple of .* = 8 "):
        _config("--global_batch_size=100", "--micro_batch_size=4", "--replicas=2",
                "--strategy=mirrored")
    # Accumulation together with replicas: 768 on 8 mirrored GPUs.
    config = _config("--global_batch_size=768", "--micro_batch_size=32", "--replicas=8",
                     "--strategy=mirrored")
    assert (config.gradient_accumulation, config.plan.examples_per_step_call) == (3, 768)
    with pytest.raises(ValueError, match="needs --gradient_accumulation=24.*give one of"):
        _config("--global_batch_size=96", "--micro_batch_size=4", "--gradient_accumulation=3")


def test_the_large_batch_flagfile_plans_graphcores_layout():
    config = _config(f"--flagfile={REPO / 'flags' / 'b4-g16-gn-lars.flags'}")
    p = config.plan
    assert (p.strategy, p.global_batch_size, p.devices_needed, p.pipeline_splits) == (
        "ipu", 6144, 16, ("block4a",))
    assert (p.examples_per_step_call // p.replicas,
            p.step_calls_per_execution % p.gradient_accumulation) == (3, 0)


@pytest.mark.parametrize("argv,pattern", [
    (["--pipeline_splits=block9z"],
     r"pipeline split 'block9z' is not a block of efficientnet-tiny-g16-lnpn; valid split "
     r"points: \['block1a'"),
    (["--pipeline_splits=block4a,block2a"], "must follow the forward order"),
    (["--strategy=mirrored", "--replicas=2", "--pipeline_splits=block2a"],
     "run only with --strategy=ipu"),
    (["--replicas=2"], "--strategy=default runs one replica"),
])
def test_bad_plans_fail_when_the_flags_are_read(argv, pattern):
    with pytest.raises(ValueError, match=pattern):
        _config("--model=efficientnet-tiny-g16-lnpn", *argv)


@pytest.mark.skipif(importlib.util.find_spec("horovod") is not None,
                    reason="horovod is installed here")
def test_missing_horovod_names_the_install_target(tmp_path):
    config = _config("--strategy=horovod", "--replicas=2", f"--model_dir={tmp_path}")
    with pytest.raises(ImportError, match="make install-horovod"):
        run(config)
    assert not any(tmp_path.iterdir())


def test_the_trainer_asks_for_a_runtime_instead_of_ignoring_the_plan(tmp_path):
    for plan in (dict(strategy="mirrored", replicas=2), dict(pipeline_splits="block3a")):
        config = TrainConfig(model_dir=str(tmp_path), **plan)
        with pytest.raises(ValueError, match=r"keras_efficientnet.distribute.run\(config\)"):
            trainer.train_and_evaluate(config)


def test_cli_reports_a_bad_split_in_one_line(tmp_path, capsys):
    from keras_efficientnet.cli import train

    try:
        flags.FLAGS(["prog", f"--flagfile={REPO / 'flags' / 'smoke.flags'}",
                     "--pipeline_splits=block99", f"--model_dir={tmp_path}"])
        assert train.main(["prog"]) == 2
    finally:
        flags.FLAGS.unparse_flags()
    err = capsys.readouterr().err
    assert "error: pipeline split 'block99' is not a block" in err
    assert not any(tmp_path.iterdir())
