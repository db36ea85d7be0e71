"""Replicas as horovodrun processes, one device each, with horovod's all-reduce in the step."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_efficientnet.distribute import train_loop
from keras_efficientnet.training.plan import ExecutionPlan
from keras_efficientnet.training.runtime import RuntimeBase, first_step, skip_seen


def import_horovod():
    """`horovod.tensorflow`, or an ImportError saying how to install it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as error:
        raise ImportError(
            f"--strategy=horovod needs horovod built for TensorFlow ({error}); run "
            "`make install-horovod` (builds horovod 0.28.1 into .venv) and launch with "
            "`horovodrun -np N python -m keras_efficientnet.train ...`") from None
    return hvd


def broadcast_variables(variables, hvd=None, root_rank: int = 0) -> None:
    """Copies rank `root_rank`'s values into every worker's `variables` (call once, first)."""
    hvd = hvd or import_horovod()
    for variable in variables:
        variable.assign(hvd.broadcast(variable.value, root_rank=root_rank,
                                      name=variable.path.replace("/", "_")))


def make_horovod_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss, *,
                            hvd=None, micro_batches: int = 1):
    """A `tf.function` step(x, y) -> loss averaged over workers, with horovod's allreduce.

    Each worker sums the gradients of its `micro_batches` micro-batches, each example's loss
    divided by the worker's examples per step (so: its mean); `hvd.allreduce(...,
    op=hvd.Average)` then averages gradients (and the reported loss) once per update, so equal
    worker batches give the gradient of the global mean. Horovod's Keras callbacks and
    DistributedOptimizer assume tf.keras, hence the low-level API.
    """
    hvd = hvd or import_horovod()
    loss_fn = train_loop.per_example_loss(loss)
    variables = model.trainable_variables
    optimizer.build(variables)

    def step(x, y):
        value, grads = train_loop.accumulate_gradients(
            model, x, y, loss_fn, divisor=tf.cast(tf.shape(x)[0], tf.float32),
            micro_batches=micro_batches, regularization_weight=1.0 / micro_batches,
            scale_loss=optimizer.scale_loss)
        grads = [hvd.allreduce(g, op=hvd.Average, name=f"grad_{i}") for i, g in enumerate(grads)]
        optimizer.apply(grads, variables)
        return hvd.allreduce(value, op=hvd.Average, name="loss")

    return tf.function(step, jit_compile=False)


class HorovodRuntime(RuntimeBase):
    """One replica per horovodrun process; each reads only its shard of the input.

    Rank r's input pipeline is shard r of `plan.replicas` (so each process decodes only its
    share); the step sums its micro-batches and all-reduces once per update; rank 0's weights
    and optimizer state are broadcast before training (also after a resume), and only rank 0
    writes checkpoints and results.

    Args:
        plan: an `ExecutionPlan` with strategy "horovod".
        hvd: `horovod.tensorflow` (default: imported when the runtime starts).
    """

    evaluates_in_place = True  # a plain model per process

    def __init__(self, plan: ExecutionPlan, hvd=None):
        self.plan = plan
        self.hvd = hvd

    def start(self) -> None:
        self.hvd = self.hvd or import_horovod()
        self.hvd.init()  # idempotent; horovodrun's rendezvous has already met every peer
        if self.hvd.size() != self.plan.replicas:
            raise ValueError(f"--replicas={self.plan.replicas} but horovodrun started "
                             f"{self.hvd.size()} processes; pass --replicas equal to "
                             "horovodrun's -np")

    @property
    def is_chief(self) -> bool:
        return self.hvd.rank() == 0

    def input_context(self) -> tf.distribute.InputContext:
        """This process's input pipeline: shard `rank` of `size`, one replica each."""
        return tf.distribute.InputContext(num_input_pipelines=self.hvd.size(),
                                          input_pipeline_id=self.hvd.rank(),
                                          num_replicas_in_sync=self.hvd.size())

    def _sum_over_replicas(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(self.hvd.allreduce(tf.constant(values), op=self.hvd.Sum,
                                             name="resume_epoch"))

    def _stop_vote(self, watch) -> train_loop.StopVote:
        """SIGTERM/SIGINT stop every rank at the same step (see train_loop.StopVote)."""
        size, rank = self.hvd.size(), self.hvd.rank()
        return train_loop.StopVote(
            watch, lambda flag: self.hvd.allreduce(train_loop.one_hot_vote(rank, size, flag),
                                                   op=self.hvd.Sum, name="stop_vote"),
            [f"rank {r}" for r in range(size)])

    def fit(self, model, make_dataset, *, epochs, step_calls_per_epoch, initial_epoch=0,
            start_step=None, callbacks=(), verbose=1, watch=None):
        train_loop.check_same_start(initial_epoch, self._sum_over_replicas, self.hvd.size(),
                                    step_calls_per_epoch)
        data = skip_seen(make_dataset(self.input_context()),
                         first_step(initial_epoch, step_calls_per_epoch, start_step))
        step = make_horovod_train_step(model, model.optimizer, model.loss, hvd=self.hvd,
                                       micro_batches=self.plan.micro_batches_per_step_call)
        # Same start everywhere: rank 0's weights and optimizer state (e.g. after resume).
        broadcast_variables([*model.variables, *model.optimizer.variables], self.hvd)
        return train_loop.fit_together(
            model, step, data, watch=watch, make_vote=self._stop_vote, epochs=epochs,
            step_calls_per_epoch=step_calls_per_epoch, initial_epoch=initial_epoch,
            step_calls_per_execution=self.plan.step_calls_per_execution, callbacks=callbacks,
            verbose=verbose)
