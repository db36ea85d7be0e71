"""The project's own train step and loop, for plans Keras' `fit` cannot run.

Keras 3 `fit` fails under MultiWorkerMirroredStrategy (keras#20585), horovod's Keras integration
assumes tf.keras, and a step that sums several micro-batches' gradients before one update (the
plan's accumulation with replicas, and pipeline stages) is not a Keras train step.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from keras_efficientnet.training.preemption import Preempted


def per_example_loss(loss):
    """`loss` as a function returning one value per example (a Keras Loss loses its reduction)."""
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        config = loss.get_config()
        config["reduction"] = None
        return type(loss).from_config(config)
    return loss


def accumulate_gradients(model: keras.Model, x, y, loss_fn, *, divisor, micro_batches: int = 1,
                         regularization_weight: float = 1.0, scale_loss=None):
    """(loss, gradients) summed over `micro_batches` equal pieces of the batch `(x, y)`.

    Each piece contributes sum(per-example loss) / `divisor` (+ `regularization_weight` x the
    model's own losses), so with `divisor` the examples of one update the sum is the gradient of
    the update's mean loss, exactly as one pass over all its examples (for batch-independent
    norms; BatchNorm sees each micro-batch's statistics, as Keras' accumulating optimizer does).
    `scale_loss` (a LossScaleOptimizer's) scales each piece's loss before the backward pass; the
    returned loss is unscaled. The pieces run in a `tf.range` loop: one traced body, whatever the
    accumulation count.
    """
    variables = model.trainable_variables

    def one(xm, ym):
        with tf.GradientTape() as tape:
            # Losses in float32 whatever the compute precision (mixed_float16 outputs float16).
            predictions = tf.cast(model(xm, training=True), tf.float32)
            value = tf.reduce_sum(loss_fn(ym, predictions)) / divisor
            if model.losses:
                value += tf.add_n(model.losses) * regularization_weight
            scaled = scale_loss(value) if scale_loss is not None else value
        grads = tape.gradient(scaled, variables,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return value, grads

    if micro_batches == 1:
        return one(x, y)
    batch = x.shape[0]
    if batch is not None and batch % micro_batches:
        raise ValueError(f"a batch of {batch} examples cannot be cut into {micro_batches} "
                         "equal micro-batches")
    xs = tf.reshape(x, [micro_batches, -1, *x.shape[1:]])
    ys = tf.reshape(y, [micro_batches, -1, *y.shape[1:]])
    # Sums start at zero so that the model is traced once, in the loop body.
    total = tf.zeros([], tf.float32)
    grads = [tf.zeros(v.shape, v.dtype) for v in variables]
    for m in tf.range(micro_batches):
        value, more = one(xs[m], ys[m])
        total += value
        grads = [a + b for a, b in zip(grads, more)]
    return total, grads


def distribute_batch(strategy, x, y):
    """Cuts one global batch (held whole by this process) into each local replica's slice.

    Replica r of R takes rows [r * n / R, (r + 1) * n / R), so the replicas together see the
    batch exactly once.
    """
    replicas = strategy.num_replicas_in_sync
    batch = int(x.shape[0])
    if batch % replicas:
        raise ValueError(f"global batch of {batch} examples cannot be split evenly over "
                         f"{replicas} replicas")
    per_replica = batch // replicas

    def piece(context, tensor):
        start = context.replica_id_in_sync_group * per_replica
        return tensor[start:start + per_replica]

    # Two calls (images, labels) keep each a plain per-replica value that `strategy.run` takes.
    images = strategy.experimental_distribute_values_from_function(lambda c: piece(c, x))
    labels = strategy.experimental_distribute_values_from_function(lambda c: piece(c, y))
    return images, labels


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss, *,
                    global_batch_size: int, strategy=None, micro_batches: int = 1):
    """A `tf.function` step(x, y) -> mean loss of one update, on one device or any strategy.

    Each replica sums the gradients of its `micro_batches` micro-batches (see
    `accumulate_gradients`) with every example's loss divided by `global_batch_size` (the
    examples of one update, all replicas together), then `optimizer.apply` all-reduces (a sum)
    and updates once: the gradient of the update's mean loss. Build the model and call this
    under `strategy.scope()`; feed per-replica values (`distribute_batch`, or a distributed
    dataset).
    """
    strategy = strategy or tf.distribute.get_strategy()
    loss_fn = per_example_loss(loss)
    variables = model.trainable_variables
    with strategy.scope():
        optimizer.build(variables)  # Slots must exist before the step is traced in a replica.
    weight = 1.0 / (strategy.num_replicas_in_sync * micro_batches)

    def replica_step(x, y):
        value, grads = accumulate_gradients(
            model, x, y, loss_fn, divisor=global_batch_size, micro_batches=micro_batches,
            regularization_weight=weight, scale_loss=optimizer.scale_loss)
        # A LossScaleOptimizer (mixed_float16) unscales in `apply`.
        optimizer.apply(grads, variables)
        return value

    def step(x, y):
        per_replica = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return tf.function(step, jit_compile=False)


def check_same_start(initial_epoch: int, sum_over_replicas, replicas: int,
                     step_calls_per_epoch: int = 0) -> None:
    """Raises unless every replica resumes from `initial_epoch` with the same
    `step_calls_per_epoch` left (a mid-epoch resume runs the epoch's remaining ones first).

    `sum_over_replicas(array)` all-reduces a float64 array (each replica contributes its
    own). All values are equal exactly when n * sum(e^2) == sum(e)^2, and every process sees the
    same sums, so all raise together instead of some waiting forever in a collective.
    """
    values = np.array([initial_epoch, initial_epoch ** 2, step_calls_per_epoch,
                       step_calls_per_epoch ** 2], "float64")
    total, squares, steps, steps_squares = sum_over_replicas(values)
    fix = ("every worker must read the chief's checkpoints, so give all of them the same "
           "--model_dir on a filesystem they share (or --noresume on all)")
    if not np.isclose(replicas * squares, total * total):
        raise ValueError(
            f"the workers resume from different epochs (this one from epoch {initial_epoch}, "
            f"the mean over the {replicas} replicas is {total / replicas:g}): {fix}")
    if not np.isclose(replicas * steps_squares, steps * steps):
        raise ValueError(
            f"the workers resume from different steps of epoch {initial_epoch} (this one has "
            f"{step_calls_per_epoch} steps left, the mean over the {replicas} replicas is "
            f"{steps / replicas:g}): {fix}")


class StopVote:
    """The processes of a run agree, at each host call, whether a signal stops them all there.

    Each replica contributes its process's signal number (0: none) at its own index of a
    vector (`one_hot_vote`), one all-reduce (a sum) inside the same `tf.function` as the steps
    adds them up, so every process sees the same vector after the same step and all stop there
    together (the chief writes the checkpoint). A process alone cannot stop: its peers would
    wait in the next step's all-reduce until TensorFlow declares it dead. The signal read for
    a host call is the one received before it began; one received during it is voted at the
    next.

    Args:
        watch: the process's `preemption.SignalWatch` (`requested` is read, `agree` set).
        sum_votes: traced fn(flag) -> the sum over replicas of each one's `one_hot_vote`.
        names: one name per replica index, for the stop line ("worker 1 (host:port)").
    """

    def __init__(self, watch, sum_votes, names):
        self.watch = watch
        self.sum_votes = sum_votes
        self.names = list(names)

    def local_flag(self) -> tf.Tensor:
        return tf.constant(float(self.watch.requested or 0), tf.float32)

    def decide(self, votes) -> bool:
        """Records the agreed stop in the watch; True when the processes stop here."""
        votes = np.rint(np.asarray(votes)).astype(int)
        voters = [i for i, v in enumerate(votes) if v]
        if not voters:
            return False
        names = list(dict.fromkeys(self.names[i] for i in voters))  # replicas of one process
        self.watch.agree(votes[voters[0]], ", ".join(names))
        return True


def one_hot_vote(index, count: int, flag):
    """A replica's vote: `flag` (its process's signal number, or 0) at `index` of `count`."""
    return tf.one_hot(index, count, dtype=tf.float32) * flag


def strategy_stop_vote(strategy, watch, names) -> StopVote:
    """A `StopVote` over `strategy`'s replicas (one all-reduce of a vector of replicas)."""
    count = strategy.num_replicas_in_sync

    def vote(flag):
        index = tf.distribute.get_replica_context().replica_id_in_sync_group
        return one_hot_vote(index, count, flag)

    def sum_votes(flag):
        per_replica = strategy.run(vote, args=(flag,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return StopVote(watch, sum_votes, names)


def _host_calls(step, stop_vote: StopVote | None):
    """fn(group of (x, y)) -> the losses of one host call: its steps in one `tf.function`,
    with the stop vote when there is one."""

    @tf.function(jit_compile=False)
    def several(group):
        return tf.stack([step(x, y) for x, y in group])

    @tf.function(jit_compile=False)
    def several_and_vote(group, flag):
        losses = tf.stack([step(x, y) for x, y in group])
        return losses, stop_vote.sum_votes(flag)

    def host_call(group):
        if stop_vote is None:
            return several(group)
        losses, votes = several_and_vote(group, stop_vote.local_flag())
        stop_vote.decide(votes)
        return losses

    return host_call


def _stop_if_agreed(stop_vote: StopVote | None) -> None:
    # When no callback checkpointed and stopped (no Checkpointer), stop here all the same.
    if stop_vote is not None and stop_vote.watch.agreed is not None:
        raise Preempted(stop_vote.watch.agreed[0], by=stop_vote.watch.stopped_by())


def fit(model: keras.Model, step, data, *, epochs: int, step_calls_per_epoch: int,
        initial_epoch: int = 0, step_calls_per_execution: int = 1, distribute=None,
        callbacks=(), verbose: int = 1,
        stop_vote: StopVote | None = None) -> keras.callbacks.History:
    """The project's training loop: `step(x, y) -> loss` over `data`, with Keras callbacks.

    What `model.fit` does, for steps it cannot run: epochs of `step_calls_per_epoch` step calls
    from one iterator over `data` (each element cut by `distribute(x, y)` when given),
    `step_calls_per_execution` step calls per host call, and the callbacks' hooks in Keras'
    order with `logs["loss"]` the epoch's running mean loss. `model.stop_training` stops it.
    Returns the History callback, as `fit` does. With `stop_vote` each host call also votes on
    a stop (see `StopVote`), in the same `tf.function` as its steps; the checkpoint callback
    then stops on the agreed signal.
    """
    per_call = step_calls_per_execution
    if not isinstance(per_call, int) or per_call < 1:
        raise ValueError(f"step_calls_per_execution must be a positive int, received "
                         f"{per_call!r}")
    distribute = distribute or (lambda x, y: (x, y))
    callbacks = keras.callbacks.CallbackList(
        list(callbacks), add_history=True, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=step_calls_per_epoch)
    host_call = _host_calls(step, stop_vote)
    iterator = iter(data)
    model.stop_training = False
    callbacks.on_train_begin()
    logs: dict = {}
    for epoch in range(initial_epoch, epochs):
        callbacks.on_epoch_begin(epoch)
        total, done = 0.0, 0
        while done < step_calls_per_epoch and not model.stop_training:
            count = min(per_call, step_calls_per_epoch - done)
            callbacks.on_train_batch_begin(done)
            group = [distribute(*next(iterator)) for _ in range(count)]
            total += float(tf.reduce_sum(host_call(group)))
            done += count
            logs = {"loss": total / done}
            callbacks.on_train_batch_end(done - 1, dict(logs))
            if done < step_calls_per_epoch:  # the epoch's end is the checkpoint callback's
                _stop_if_agreed(stop_vote)
        callbacks.on_epoch_end(epoch, dict(logs))
        _stop_if_agreed(stop_vote)
        if model.stop_training:
            break
    callbacks.on_train_end(dict(logs))
    return model.history


def fit_together(model: keras.Model, step, data, *, watch, make_vote,
                 **run) -> keras.callbacks.History:
    """`fit` for the processes of one run: with the run's signal watch (a
    `preemption.SignalWatch`, or None: no signal handling), every host call votes
    (`make_vote(watch)` -> `StopVote`) and all processes stop at the same step."""
    if watch is None:
        return fit(model, step, data, **run)
    with watch.coordinated():
        return fit(model, step, data, stop_vote=make_vote(watch), **run)
