"""The fine-tune starts from the optimizer slots averaged with the weights (Graphcore averages
every checkpoint variable and restores the average with a plain saver)."""

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

from keras_efficientnet.optimizers import RMSPropTF  # noqa: E402
from keras_efficientnet.training import CheckpointManager, TrainConfig, trainer  # noqa: E402
from keras_efficientnet.training.optimizer_state import (  # noqa: E402
    SlotAverage,
    read_slots,
    restore_slots,
)

LR, RHO, MOMENTUM, EPSILON, DECAY = 0.05, 0.9, 0.9, 1e-3, 0.5
STEPS_PER_EPOCH, EPOCHS = 2, 3


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")


def _model():
    rng = np.random.default_rng(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="body"),
                              keras.layers.Dense(1, name="head")])
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.weights])
    return model


def _numpy_reference(weights, x, y):
    """TF1 RMSProp (mean square from 1, epsilon inside the root) on the two linear layers with
    the mean squared error, by hand; returns the per-epoch exponential average (DECAY) of the
    slots, as {name: [mean squares of w1, b1, w2, b2], ...}."""
    w = [np.asarray(a, "float64") for a in weights]
    ms = [np.ones_like(a) for a in w]
    mom = [np.zeros_like(a) for a in w]
    average = None
    for _ in range(EPOCHS):
        for _ in range(STEPS_PER_EPOCH):
            h = x @ w[0] + w[1]
            d = 2.0 * (h @ w[2] + w[3] - y) / y.size
            dh = d @ w[2].T
            grads = [x.T @ dh, dh.sum(0), h.T @ d, d.sum(0)]
            for i, g in enumerate(grads):
                ms[i] = RHO * ms[i] + (1 - RHO) * g ** 2
                mom[i] = MOMENTUM * mom[i] + LR * g / np.sqrt(ms[i] + EPSILON)
                w[i] = w[i] - mom[i]
        current = {"mean_square": [a.copy() for a in ms], "momentum": [a.copy() for a in mom]}
        average = current if average is None else {
            k: [DECAY * a + (1 - DECAY) * c for a, c in zip(average[k], current[k])]
            for k in current}
    return average


def _train_with_slot_average(x, y):
    model = _model()
    start = model.get_weights()
    model.compile(optimizer=RMSPropTF(LR, rho=RHO, momentum=MOMENTUM, epsilon=EPSILON),
                  loss="mse")
    average = SlotAverage(DECAY)
    data = np.concatenate([x] * STEPS_PER_EPOCH), np.concatenate([y] * STEPS_PER_EPOCH)
    for _ in range(EPOCHS):
        model.fit(*data, batch_size=len(x), shuffle=False, epochs=1, verbose=0)
        average.update(model)
    return model, start, average


def test_the_averaged_slots_restored_into_the_head_optimizer_equal_a_numpy_reference():
    x, y = _data()
    model, start, average = _train_with_slot_average(x, y)
    expected = _numpy_reference(start, x.astype("float64"), y.astype("float64"))
    slots = average.slots(model)
    assert len(slots) == 2 * 4  # mean squares, then momenta, of w1, b1, w2, b2

    # The fine-tune: a fresh model with the averaged weights, only the head trainable.
    tuned = _model()
    tuned.set_weights(average.weights_like(model))
    trained_variables = list(tuned.trainable_variables)
    tuned.get_layer("body").trainable = False
    optimizer = RMSPropTF(LR, rho=RHO, momentum=MOMENTUM, epsilon=EPSILON)
    assert restore_slots(optimizer, trained_variables, slots, tuned.trainable_variables) == 4
    head = {"mean_square": read_slots(optimizer)[:2], "momentum": read_slots(optimizer)[2:]}
    for kind in ("mean_square", "momentum"):
        for got, want in zip(head[kind], expected[kind][2:]):  # the head's kernel and bias
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-7)
    # Not the fresh state (mean square 1, momentum 0) nor the last epoch's slots.
    assert not np.allclose(head["mean_square"][0], 1.0)
    assert not np.allclose(head["momentum"][0], read_slots(model.optimizer)[6], rtol=1e-3)


def test_slots_of_another_optimizer_are_refused_in_one_line():
    model = _model()
    optimizer = RMSPropTF(LR)
    with pytest.raises(ValueError, match=r"4 saved optimizer slots do not fit RMSPropTF's 2 slot "
                                         r"kinds \(_mean_squares, _momentums\) x 4 variables"):
        restore_slots(optimizer, model.trainable_variables, [np.zeros(1)] * 4,
                      model.trainable_variables)


def test_the_trainers_finetune_starts_from_the_given_slots(tmp_path):
    # One fine-tune step whose rate is 0 (the warm-up's first step): each restored momentum
    # comes out multiplied by the momentum coefficient, where a fresh one stays 0.
    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
                         train_resolution=32, test_resolution=32, micro_batch_size=8,
                         updates_per_epoch=1, finetune_epochs=1, finetune_warmup_epochs=1,
                         optimizer="rmsprop", weight_decay=0.0, verbose=0, seed=3,
                         model_dir=str(tmp_path / "run"))
    model = trainer.build_model(config, 32, 10)
    rng = np.random.default_rng(2)
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    slots = ([rng.uniform(0.5, 1.5, s).astype("float32") for s in shapes]
             + [rng.normal(0, 1e-3, s).astype("float32") for s in shapes])
    tuned, _ = trainer.finetune(config, model.get_weights(), 10, train_examples=8,
                                optimizer_slots=slots)
    paths = [v.path for v in model.trainable_variables]
    momenta = dict(zip((v.path for v in tuned.trainable_variables),
                       read_slots(tuned.optimizer)[len(tuned.trainable_variables):]))
    assert momenta and {p.split("/")[0] for p in momenta} <= set(trainer.HEAD_LAYERS)
    for path, got in momenta.items():
        restored = slots[len(paths) + paths.index(path)]
        np.testing.assert_allclose(got, config.momentum * restored, rtol=1e-5, atol=1e-9)


def test_a_finetune_from_a_checkpoint_reads_the_slots_saved_with_its_average(tmp_path):
    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
                         train_resolution=32, test_resolution=32, mode="finetune",
                         model_dir=str(tmp_path / "run"))
    model = trainer.build_model(config, 32, 10)
    weights = model.get_weights()
    slots = [np.full(v.shape, 0.25, "float64") for v in model.trainable_variables]
    averaged = [w + 1.0 for w in weights]
    CheckpointManager(tmp_path / "run" / "checkpoints").save(
        1, model, state={"config": config.to_dict(), "num_classes": 10},
        average=averaged + slots)
    fresh, found = trainer.build_model(config, 32, 10), []
    assert trainer.load_weights_for(config, fresh, slots=found).endswith("(weight average)")
    for got, want in zip(fresh.get_weights(), averaged):
        np.testing.assert_allclose(got, want)
    assert len(found) == len(slots) and all(np.array_equal(a, b) for a, b in zip(found, slots))


def _mixed_float16():
    return trainer.precision_policy("mixed_float16")


def test_under_mixed_float16_the_slots_are_read_through_the_loss_scale_optimizer():
    # Keras' compile wraps the optimizer in a LossScaleOptimizer under mixed_float16; its
    # slots still average (against the float32 NumPy reference, to float16 compute round-off).
    x, y = _data()
    with _mixed_float16():
        model, start, average = _train_with_slot_average(x, y)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    expected = _numpy_reference(start, x.astype("float64"), y.astype("float64"))
    slots = average.slots(model)
    assert slots is not None and len(slots) == 2 * 4
    for got, want in zip(slots, expected["mean_square"] + expected["momentum"]):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-4)


def _finetune_from_checkpoint(tmp_path, trained_precision: str):
    """A checkpoint whose weight average holds slots, trained under `trained_precision`, then
    fine-tuned (one step at rate 0) under mixed_float16; returns (restored slots, momenta after
    the step by variable path, the config)."""
    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
                         train_resolution=32, test_resolution=32, micro_batch_size=8,
                         updates_per_epoch=1, finetune_epochs=1, finetune_warmup_epochs=1,
                         optimizer="rmsprop", weight_decay=0.0, verbose=0, seed=3,
                         mode="finetune", model_dir=str(tmp_path / "run"))
    with trainer.precision_policy(trained_precision):
        model = trainer.build_model(config.replace(precision=trained_precision), 32, 10)
    rng = np.random.default_rng(4)
    shapes = [tuple(v.shape) for v in model.trainable_variables]
    saved_slots = ([rng.uniform(0.5, 1.5, s) for s in shapes]
                   + [rng.normal(0, 1e-3, s) for s in shapes])
    CheckpointManager(tmp_path / "run" / "checkpoints").save(
        1, model, state={"config": config.replace(precision=trained_precision).to_dict(),
                         "num_classes": 10},
        average=[w.astype("float64") for w in model.get_weights()] + saved_slots)
    tuned_config = config.replace(precision="mixed_float16")
    with _mixed_float16():
        fresh, found = trainer.build_model(tuned_config, 32, 10), []
        trainer.load_weights_for(tuned_config, fresh, slots=found)
        tuned, _ = trainer.finetune(tuned_config, fresh.get_weights(), 10, train_examples=8,
                                    optimizer_slots=found)
    assert isinstance(tuned.optimizer, keras.optimizers.LossScaleOptimizer)
    momenta = dict(zip((v.path for v in tuned.trainable_variables),
                       read_slots(tuned.optimizer)[len(tuned.trainable_variables):]))
    paths = [v.path for v in model.trainable_variables]
    return {p: saved_slots[len(paths) + paths.index(p)] for p in momenta}, momenta, config


# Both fine-tune under mixed_float16; a run trained under it too is slow (7 s, quiet): make test
# keeps the float32-trained case and the loss-scale unwrapping test above.
@pytest.mark.parametrize("trained_precision", [
    "float32", pytest.param("mixed_float16", marks=pytest.mark.slow)])
def test_a_checkpoint_fine_tuned_under_mixed_float16_starts_from_its_averaged_slots(
        tmp_path, trained_precision):
    restored, momenta, config = _finetune_from_checkpoint(tmp_path, trained_precision)
    assert momenta and {p.split("/")[0] for p in momenta} <= set(trainer.HEAD_LAYERS)
    for path, got in momenta.items():  # one step at rate 0: momentum x the restored value
        np.testing.assert_allclose(got, config.momentum * restored[path], rtol=1e-5,
                                   atol=1e-9)


def _compiled(config, precision):
    from keras_efficientnet.training.builders import build_optimizer, compile_model

    config = config.replace(precision=precision)
    with trainer.precision_policy(precision):
        model = trainer.build_model(config, 32, 10)
        compile_model(model, build_optimizer(config, 0.01), config, 10)
    return model


def test_a_float32_checkpoint_resumes_under_mixed_float16_with_its_optimizer_state(tmp_path):
    # Its optimizer state goes into the LossScaleOptimizer's inner optimizer, which is what a
    # mixed_float16 run's own checkpoint restores; it failed with "holds 240 optimizer
    # variables but the model has 244".
    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
                         optimizer="rmsprop", micro_batch_size=4, model_dir=str(tmp_path))
    trained = _compiled(config, "float32")
    rng = np.random.default_rng(5)
    saved = [rng.uniform(0.5, 1.5, v.shape).astype(v.dtype) for v in trained.optimizer.variables]
    for variable, value in zip(trained.optimizer.variables, saved):
        variable.assign(value)
    CheckpointManager(tmp_path / "checkpoints").save(1, trained, trained.optimizer,
                                                     state={"config": config.to_dict()})
    resumed = _compiled(config, "mixed_float16")
    assert isinstance(resumed.optimizer, keras.optimizers.LossScaleOptimizer)
    scale = float(resumed.optimizer.dynamic_scale.numpy())
    CheckpointManager.restore(tmp_path / "checkpoints" / "epoch-0001", resumed,
                              resumed.optimizer)
    inner = resumed.optimizer.inner_optimizer.variables
    assert len(inner) == len(saved)
    for variable, value in zip(inner, saved):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), value)
    assert float(resumed.optimizer.dynamic_scale.numpy()) == scale  # starts afresh


@pytest.mark.slow  # two runs of the tiny model (about a minute on the loaded 2-core machine)
def test_a_float32_run_fine_tuned_under_mixed_float16_starts_from_its_averaged_slots(
        tmp_path, monkeypatch):
    # End to end: a float32 training run (2 steps, weight average with slots), then
    # --mode=finetune --precision=mixed_float16 on its model_dir: the fine-tune receives the
    # slots of the checkpoint's weight average, and the run ends with status 0.
    from keras_efficientnet.training.optimizer_state import SlotAverage

    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
                         train_resolution=32, test_resolution=32, micro_batch_size=4,
                         updates_per_epoch=2, epochs=1, eval_every=0, eval_steps=1,
                         finetune_epochs=1, optimizer="rmsprop", verbose=0, seed=3,
                         mode="train", model_dir=str(tmp_path / "run"))
    classes = trainer.train_and_evaluate(config)["num_classes"]
    checkpoint = tmp_path / "run" / "checkpoints" / "epoch-0001"
    model = trainer.build_model(config, 32, classes)
    state = CheckpointManager.restore(checkpoint, model)
    expected = SlotAverage(0.97, state["average"]).slots(model)
    assert expected and len(expected) == 2 * len(model.trainable_variables)
    real, received = trainer.finetune, []

    def finetune(*args, optimizer_slots=None, **kwargs):
        received.append([np.asarray(s) for s in optimizer_slots])
        return real(*args, optimizer_slots=optimizer_slots, **kwargs)

    monkeypatch.setattr(trainer, "finetune", finetune)
    results = trainer.train_and_evaluate(config.replace(mode="finetune",
                                                        precision="mixed_float16"))
    assert results["finetune_epochs"] == 1 and np.isfinite(results["top1"])
    assert len(received) == 1 and len(received[0]) == len(expected)
    for got, want in zip(received[0], expected):
        np.testing.assert_array_equal(got, want)
