"""A stop requested by SIGTERM or SIGINT ends with 128 + N wherever it lands: inside a Keras
layer call (Keras' call-argument injection rebuilds an `Exception` as `type(e)(message)`), in
evaluate, predict, export, the fine-tune and the evaluate/predict commands; and a stop whose
exception was swallowed or noted after a loop's last step still ends the run."""

from __future__ import annotations

import copy
import os
import pickle
import signal
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

pytestmark = pytest.mark.tf_only

from keras_efficientnet.cli import evaluate as evaluate_command  # noqa: E402
from keras_efficientnet.cli import predict as predict_command  # noqa: E402
from keras_efficientnet.training import TrainConfig, trainer  # noqa: E402
from keras_efficientnet.training.export import export_saved_model  # noqa: E402
from keras_efficientnet.training.preemption import Preempted, SignalWatch  # noqa: E402
from keras_efficientnet.training.runtime import OneDevice  # noqa: E402

# The signal the next concrete layer call sends to its own process (None: send nothing).
ARMED: list[int] = []


def _send_armed_signal(x) -> None:
    # Not while Keras builds or loads a functional model (symbolic KerasTensors): the signal
    # must land where the work is, in the traced or eager call of evaluate, predict, fit.
    if ARMED and not isinstance(x, keras.KerasTensor):
        os.kill(os.getpid(), ARMED.pop())
        signal.sigtimedwait([], 0)  # a call into C: Python runs the handler here at the latest


@keras.saving.register_keras_serializable(package="test_preemption")
class SignalInCall(keras.layers.Layer):
    """Passes its input through; its first call after `ARMED` is set sends that signal."""

    def call(self, x):
        _send_armed_signal(x)
        return x


@pytest.fixture(autouse=True)
def _disarm():
    yield
    ARMED.clear()


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 4, 3))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = SignalInCall()(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))
    model.compile(loss="sparse_categorical_crossentropy", optimizer="sgd",
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="top1"),
                           keras.metrics.SparseTopKCategoricalAccuracy(2, name="top5")])
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (4, 4, 4, 3)).astype("float32"), np.array([0, 1, 2, 0])


PHASES = {
    "evaluate": lambda model, tmp: trainer.evaluate(
        model, tf.data.Dataset.from_tensor_slices(_data()).batch(2), steps=2),
    "predict": lambda model, tmp: model.predict(_data()[0], verbose=0),
    "predict_on_batch": lambda model, tmp: model.predict_on_batch(_data()[0]),
    "fit": lambda model, tmp: model.fit(*_data(), epochs=1, verbose=0),
    "export": lambda model, tmp: export_saved_model(model, tmp / "export", serving="off"),
}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("phase", sorted(PHASES))
def test_a_signal_inside_a_layer_call_stops_each_phase_with_128_plus_its_number(
        phase, signum, tmp_path):
    model = _model()
    with pytest.raises(Preempted) as stopped, SignalWatch():
        ARMED.append(signum)
        PHASES[phase](model, tmp_path)
    assert not ARMED, "the layer call never ran"
    assert stopped.value.signum == signum
    assert stopped.value.exit_code == {signal.SIGTERM: 143, signal.SIGINT: 130}[signum]
    assert str(stopped.value).startswith(f"stopped by {signal.Signals(signum).name} outside "
                                         "a training step")
    if phase == "export":  # the temporary folder went with it
        assert not any(tmp_path.iterdir())


class _ArmsAtFit(OneDevice):
    """The one-device runtime, arming the signal as its fit starts (after the model is built)."""

    def fit(self, *args, **kwargs):
        ARMED.append(signal.SIGTERM)
        return super().fit(*args, **kwargs)


def test_a_sigterm_inside_a_layer_call_of_the_fine_tune_stops_it_with_143(tmp_path, monkeypatch):
    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
                         train_resolution=32, test_resolution=32, micro_batch_size=8,
                         updates_per_epoch=1, finetune_epochs=1, optimizer="rmsprop",
                         verbose=0, seed=3, model_dir=str(tmp_path / "run"))
    weights = trainer.build_model(config, 32, 10).get_weights()
    dense_call = keras.layers.Dense.call  # the classifier: a head layer the fine-tune trains

    def signalling_call(self, inputs, *args, **kwargs):
        _send_armed_signal(inputs)
        return dense_call(self, inputs, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Dense, "call", signalling_call)
    with pytest.raises(Preempted) as stopped, SignalWatch() as watch:
        trainer.finetune(config, weights, 10, train_examples=8,
                         runtime=_ArmsAtFit(config.plan), watch=watch)
    assert not ARMED and stopped.value.exit_code == 143


def _saved_model_and_image(tmp_path):
    path = tmp_path / "signal.keras"
    _model().save(path)
    folder = tmp_path / "photos" / "validation"
    for i, name in enumerate(("ant", "bee", "cow")):
        (folder / name).mkdir(parents=True)
        Image.fromarray(np.full((6, 6, 3), 40 * i, np.uint8)).save(folder / name / "0.png")
    return path, folder


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_evaluate_and_predict_commands_stop_in_one_line_with_128_plus_n(
        tmp_path, capsys, signum):
    model, folder = _saved_model_and_image(tmp_path)
    code, handlers = 128 + signum, [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
    ARMED.append(signum)
    assert evaluate_command.main(["evaluate", f"--model_file={model}", "--resolution=4",
                                  f"--dataset=folder:{folder.parent}"]) == code
    ARMED.append(signum)
    assert predict_command.main(["predict", f"--model_file={model}", str(folder),
                                 f"--output={tmp_path / 'out.csv'}"]) == code
    lines = capsys.readouterr().err.strip().splitlines()
    name = signal.Signals(signum).name
    assert lines == [f"stopped by {name}: nothing was scored; run the same command again",
                     f"stopped by {name}: the predictions are incomplete and --output was not "
                     "written; run the same command again"]
    assert not (tmp_path / "out.csv").exists()
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == handlers  # put back


class _SignalInDestructor:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0)  # the handler raises here; Python only prints it


def test_a_stop_swallowed_by_a_destructor_still_ends_the_watch(monkeypatch):
    swallowed = []  # what Python hands to sys.unraisablehook (it prints "Exception ignored")
    monkeypatch.setattr(sys, "unraisablehook", swallowed.append)
    with pytest.raises(Preempted) as stopped, SignalWatch():
        _SignalInDestructor()  # collected at once: __del__ runs, its exception goes nowhere
    assert [s.exc_type for s in swallowed] == [Preempted]
    assert stopped.value.exit_code == 143


def test_a_signal_noted_after_the_loops_last_step_boundary_stops_when_the_loop_ends():
    with SignalWatch() as watch:
        with pytest.raises(Preempted, match="stopped by SIGINT outside a training step"):
            with watch.deferred():
                os.kill(os.getpid(), signal.SIGINT)  # only noted: no step boundary follows
                signal.sigtimedwait([], 0)
                assert watch.requested == signal.SIGINT
        watch.requested = None


def test_an_error_while_a_stop_was_only_noted_is_that_error():
    # A NaN loss after the signal was noted: the run failed, and says so (exit 1, not 143).
    with SignalWatch() as watch:
        with pytest.raises(ArithmeticError), watch.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)
            raise ArithmeticError("loss is NaN")
        watch.requested = None


def test_the_stop_passes_except_exception_and_survives_copy_and_pickle():
    stopped = Preempted(signal.SIGTERM, "runs/x/checkpoints/epoch-0002", 7, by="worker 1")
    with pytest.raises(Preempted):
        try:
            raise stopped
        except Exception:  # what Keras' and libraries' fallbacks catch
            pytest.fail("Preempted was caught by `except Exception`")
    for rebuilt in (copy.copy(stopped), pickle.loads(pickle.dumps(stopped))):
        assert (rebuilt.signum, rebuilt.checkpoint, rebuilt.step, rebuilt.by) == (
            signal.SIGTERM, "runs/x/checkpoints/epoch-0002", 7, "worker 1")
        assert str(rebuilt) == str(stopped)


def test_the_training_command_in_evaluate_mode_exits_143_in_one_line(tmp_path, monkeypatch,
                                                                        capsys):
    # The red team's case: SIGTERM inside a layer call of --mode=evaluate exited 2 with a
    # garbled line. The classifier (a Dense) sends it while evaluate traces the model.
    from absl import flags

    from keras_efficientnet.cli import train
    from tests.reliability.clitools import REPO

    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="digits",
                         test_resolution=64, model_dir=str(tmp_path / "run"))
    weights = tmp_path / "init.weights.h5"
    trainer.build_model(config, 64, 10).save_weights(weights)
    dense_call = keras.layers.Dense.call

    def signalling_call(self, inputs, *args, **kwargs):
        _send_armed_signal(inputs)
        return dense_call(self, inputs, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Dense, "call", signalling_call)
    ARMED.append(signal.SIGTERM)
    try:
        flags.FLAGS(["prog", f"--flagfile={REPO / 'flags' / 'smoke.flags'}", "--mode=evaluate",
                     f"--init_checkpoint={weights}", f"--model_dir={tmp_path / 'run'}"])
        status = train.main(["prog"])
    finally:
        flags.FLAGS.unparse_flags()
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith(("error", "stopped"))]
    assert not ARMED and status == 143
    assert lines == ["stopped by SIGTERM outside a training step: nothing new to save (earlier "
                     "checkpoints are intact); run the same command to resume"]


@pytest.mark.slow  # a training epoch and its validation (about 25 s on 2 cores)
def test_a_sigterm_inside_a_layer_call_of_the_validation_stops_at_the_epochs_checkpoint(
        tmp_path, monkeypatch):
    # Validation runs inside the training loop: the signal is noted, the epoch's checkpoint is
    # written and the run stops there (resumable), with 143.
    from keras_efficientnet.training import validation

    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
                         train_resolution=32, test_resolution=32, micro_batch_size=8,
                         updates_per_epoch=2, epochs=2, eval_every=1, eval_steps=1,
                         finetune_epochs=0, verbose=0, seed=3, model_dir=str(tmp_path / "run"))
    dense_call, validate = keras.layers.Dense.call, validation.Validation.__call__

    def signalling_call(self, inputs, *args, **kwargs):
        _send_armed_signal(inputs)
        return dense_call(self, inputs, *args, **kwargs)

    def arming_validation(self, *args, **kwargs):
        ARMED.append(signal.SIGTERM)
        return validate(self, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Dense, "call", signalling_call)
    monkeypatch.setattr(validation.Validation, "__call__", arming_validation)
    with pytest.raises(Preempted) as stopped:
        trainer.train(config, 10, train_examples=16)
    assert not ARMED and stopped.value.exit_code == 143
    assert stopped.value.step == 2  # the end of the first epoch, not the second
    assert stopped.value.checkpoint == str(tmp_path / "run" / "checkpoints" / "epoch-0001")
