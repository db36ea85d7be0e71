"""Graphcore's reduced-resolution fine-tune: the head only, at the test resolution, at its own
batch (`TrainConfig.finetune_plan`) and learning rate."""

from __future__ import annotations

import keras

from keras_efficientnet import optimizers as opt_lib
from keras_efficientnet.training.builders import (
    build_datasets,
    build_model,
    build_optimizer,
    compile_model,
    lr_schedule,
    reporting_data_errors,
    resolutions,
)
from keras_efficientnet.training.callbacks import DivergenceGuard, NonFiniteLossGuard, Throughput
from keras_efficientnet.training.config import TrainConfig
from keras_efficientnet.training.optimizer_state import restore_slots
from keras_efficientnet.training.runtime import OneDevice

# Layers the reduced-resolution fine-tune trains: the head conv, its norm (and proxy norm
# activation) and the classifier. Everything else is frozen.
HEAD_LAYERS = ("head_conv", "head_norm", "head_act", "predictions")



def finetune_config(config: TrainConfig) -> TrainConfig:
    """The config of the fine-tune phase: its batch (`TrainConfig.finetune_plan`; the
    micro-batch, replicas, strategy and stages stay), RMSProp's rho rescaled to that batch as
    Graphcore derives it (1 - rho linear in the batch: 0.953125 at 768, 0.96875 at 512), no
    per-step weight EMA."""
    ratio = config.finetune_global_batch_size / config.global_batch_size
    return config.replace(gradient_accumulation=config.finetune_plan.micro_batches_per_update,
                          rmsprop_rho=1.0 - (1.0 - config.rmsprop_rho) * ratio, ema_decay=0.0)



def finetune_schedule(config: TrainConfig,
                      optimizer_applies_per_epoch: int) -> opt_lib.WarmupSchedule:
    """Graphcore's fine-tune rate: cosine to 0 over `finetune_epochs` counted from step 0,
    under a linear warm-up of `finetune_warmup_epochs` (which may outlast the fine-tune), peak
    `finetune_learning_rate`, else `finetune_learning_rate_per_sample` x its batch.
    `optimizer_applies_per_epoch` is the schedule's unit (`plan.optimizer_applies_per_epoch`)."""
    peak = (config.finetune_learning_rate or
            config.finetune_learning_rate_per_sample * config.finetune_global_batch_size)
    shape = config.replace(lr_schedule="cosine", warmup_epochs=config.finetune_warmup_epochs,
                           end_learning_rate_ratio=0.0)
    return lr_schedule(shape, optimizer_applies_per_epoch, config.finetune_epochs, peak)



def _head_only_model(config: TrainConfig, runtime, model_weights: list, num_classes: int,
                     updates: int, optimizer_slots: list | None) -> keras.Model:
    """The model at the test resolution with `model_weights`, only `HEAD_LAYERS` trainable,
    compiled with the fine-tune's optimizer (its head's state from `optimizer_slots` when
    given), under `runtime` (whose plan is the fine-tune's)."""
    tuned = finetune_config(config)
    _, test_res = resolutions(config)
    with runtime.scope():
        model = build_model(config, test_res, num_classes)
        model.set_weights(model_weights)
        trained_variables = list(model.trainable_variables)
        for layer in model.layers:
            layer.trainable = layer.name in HEAD_LAYERS
        runtime.attach(model)
        schedule = finetune_schedule(config, tuned.plan.optimizer_applies_per_epoch(updates))
        compile_model(model, build_optimizer(tuned, schedule), tuned, num_classes)
        if optimizer_slots:
            restore_slots(model.optimizer, trained_variables, optimizer_slots,
                          model.trainable_variables)
    return model


def _guards(config: TrainConfig, num_classes: int, step_calls: int) -> list:
    guards = [NonFiniteLossGuard(step_calls)]
    if config.divergence_factor > 0:
        guards.append(DivergenceGuard(num_classes, config.divergence_factor,
                                      config.divergence_steps, step_calls))
    return guards


def finetune(config: TrainConfig, model_weights: list, num_classes: int,
             train_examples: int, runtime=None, skip_counter=None, watch=None,
             optimizer_slots: list | None = None) -> tuple[keras.Model, dict]:
    """Graphcore's fine-tune (their README, section 5; `--variable-filter Top`): only the head
    block trains, at the test resolution, on training images with evaluation preprocessing and
    the run's Mixup/CutMix, from `model_weights` (the weight average), at the fine-tune batch
    (`finetune_config`) and rate (`finetune_schedule`), under `runtime` replanned to the
    fine-tune's plan (`Runtime.replan`), with the run's signal `watch`. `optimizer_slots` (the
    training optimizer's, averaged with the weights: `optimizer_state`) start the head's
    optimizer state, as Graphcore's restore of the averaged checkpoint does; None: fresh.

    It writes no checkpoints (a few head-only epochs): a run stopped here redoes it."""
    tuned = finetune_config(config)
    plan = tuned.plan
    runtime = (runtime or OneDevice(config.plan)).replan(plan)
    _, test_res = resolutions(config)
    keras.utils.set_random_seed(config.seed + 1)
    updates = plan.updates_per_epoch(train_examples, config.updates_per_epoch)
    step_calls = plan.step_calls_per_epoch(updates)
    model = _head_only_model(config, runtime, model_weights, num_classes, updates,
                             optimizer_slots)
    throughput = Throughput(plan.examples_per_step_call, plan.step_calls_per_execution)

    def make_dataset(input_context):
        return build_datasets(tuned, test_res, training=True, augment=False, mix=True,
                              split=config.train_split, repeat=True, num_classes=num_classes,
                              input_context=input_context, skip_counter=skip_counter)

    with reporting_data_errors(skip_counter):
        history = runtime.fit(model, make_dataset, epochs=config.finetune_epochs,
                              step_calls_per_epoch=step_calls,
                              callbacks=[throughput, *_guards(config, num_classes, step_calls)],
                              verbose=config.verbose, watch=watch)
    return model, {"history": history.history, "images_per_second":
                   throughput.images_per_second, "resolution": test_res,
                   "global_batch_size": plan.examples_per_update}
