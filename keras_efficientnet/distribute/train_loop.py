"""The project's own train step for tf.distribute and horovod (Keras 3 fit fails multi-worker)."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_efficientnet.distribute.pipeline import per_example_loss


def distribute_batch(strategy, x, y):
    """Cuts one global batch (held whole by every worker) into each local replica's slice.

    Replica r of R takes rows [r * n / R, (r + 1) * n / R): the same split on every worker, so
    the replicas together see the global batch exactly once.
    """
    replicas = strategy.num_replicas_in_sync
    batch = int(x.shape[0])
    if batch % replicas:
        raise ValueError(f"global batch of {batch} examples cannot be split evenly over "
                         f"{replicas} replicas")
    per_replica = batch // replicas

    def piece(context):
        start = context.replica_id_in_sync_group * per_replica
        return x[start:start + per_replica], y[start:start + per_replica]

    # Two calls (images, labels) keep each a plain per-replica value that `strategy.run` takes.
    images = strategy.experimental_distribute_values_from_function(lambda c: piece(c)[0])
    labels = strategy.experimental_distribute_values_from_function(lambda c: piece(c)[1])
    return images, labels


def make_train_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, loss, *,
                    global_batch_size: int, strategy=None):
    """A `tf.function` step(x, y) -> mean loss, for one device, mirrored or multi-worker.

    `x, y = distribute_batch(strategy, images, labels)`. Each replica divides its summed loss by the
    *global* batch, so the strategy's all-reduce (a sum, done inside `optimizer.apply`) yields
    the gradient of the global-batch mean. Build the model and call this under `strategy.scope()`.
    """
    strategy = strategy or tf.distribute.get_strategy()
    loss_fn = per_example_loss(loss)
    variables = model.trainable_variables
    with strategy.scope():
        optimizer.build(variables)  # Slots must exist before the step is traced in a replica.

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            # Losses in float32 whatever the compute precision (mixed_float16 outputs float16).
            predictions = tf.cast(model(x, training=True), tf.float32)
            value = tf.reduce_sum(loss_fn(y, predictions)) / global_batch_size
            if model.losses:
                value += tf.add_n(model.losses) / strategy.num_replicas_in_sync
            # A LossScaleOptimizer (mixed_float16) scales here and unscales in `apply`.
            scaled = optimizer.scale_loss(value)
        grads = tape.gradient(scaled, variables)
        optimizer.apply(grads, variables)
        return value

    def step(x, y):
        per_replica = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return tf.function(step, jit_compile=False)


def import_horovod():
    """`horovod.tensorflow`, or an ImportError saying how to install it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as error:
        raise ImportError(
            f"backend 'horovod' needs horovod built for TensorFlow ({error}); run "
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
                            hvd=None):
    """A `tf.function` step(x, y) -> loss averaged over workers, with horovod's allreduce.

    Each worker takes the mean over its own batch; `hvd.allreduce(..., op=hvd.Average)` then
    averages gradients (and the reported loss), so equal worker batches give the global mean.
    Horovod's Keras callbacks and DistributedOptimizer assume tf.keras, hence the low-level API.
    """
    hvd = hvd or import_horovod()
    loss_fn = per_example_loss(loss)
    variables = model.trainable_variables
    optimizer.build(variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            predictions = tf.cast(model(x, training=True), tf.float32)
            value = tf.reduce_mean(loss_fn(y, predictions))
            if model.losses:
                value += tf.add_n(model.losses)
            scaled = optimizer.scale_loss(value)
        grads = tape.gradient(scaled, variables)
        grads = [hvd.allreduce(g, op=hvd.Average, name=f"grad_{i}") for i, g in enumerate(grads)]
        optimizer.apply(grads, variables)
        return hvd.allreduce(value, op=hvd.Average, name="loss")

    return tf.function(step, jit_compile=False)


def fit(model: keras.Model, step, data, *, epochs: int, steps_per_epoch: int,
        initial_epoch: int = 0, device_iterations: int = 1, distribute=None, callbacks=(),
        verbose: int = 1) -> keras.callbacks.History:
    """The project's training loop: `step(x, y) -> loss` over `data`, with Keras callbacks.

    What `model.fit` does, for steps it cannot run (multi-worker, horovod, pipeline stages):
    epochs of `steps_per_epoch` steps from one iterator over `data` (global batches, each cut by
    `distribute(x, y)`), `device_iterations` steps per host call, and the callbacks' hooks in
    Keras' order with `logs["loss"]` the epoch's running mean loss. `model.stop_training` stops
    it. Returns the History callback, as `fit` does.
    """
    if not isinstance(device_iterations, int) or device_iterations < 1:
        raise ValueError(f"device_iterations must be a positive int, received "
                         f"{device_iterations!r}")
    distribute = distribute or (lambda x, y: (x, y))
    callbacks = keras.callbacks.CallbackList(
        list(callbacks), add_history=True, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps_per_epoch)

    @tf.function(jit_compile=False)
    def several(group):
        return tf.stack([step(x, y) for x, y in group])

    iterator = iter(data)
    model.stop_training = False
    callbacks.on_train_begin()
    logs: dict = {}
    for epoch in range(initial_epoch, epochs):
        callbacks.on_epoch_begin(epoch)
        total, done = 0.0, 0
        while done < steps_per_epoch and not model.stop_training:
            count = min(device_iterations, steps_per_epoch - done)
            callbacks.on_train_batch_begin(done)
            group = [distribute(*next(iterator)) for _ in range(count)]
            total += float(tf.reduce_sum(several(group)))
            done += count
            logs = {"loss": total / done}
            callbacks.on_train_batch_end(done - 1, dict(logs))
        callbacks.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            break
    callbacks.on_train_end(dict(logs))
    return model.history


def run_steps(step, batches, *, device_iterations: int = 1) -> list[float]:
    """Runs `step(x, y)` over (x, y) batches, `device_iterations` steps per host round trip.

    Returns the per-step losses. Grouping steps into one `tf.function` call is what the plan's
    device iterations mean off the IPU: fewer host synchronisations per step.
    """
    if not isinstance(device_iterations, int) or device_iterations < 1:
        raise ValueError(f"device_iterations must be a positive int, received "
                         f"{device_iterations!r}")
    batches = list(batches)

    @tf.function(jit_compile=False)
    def several(group):
        return [step(x, y) for x, y in group]

    losses: list[float] = []
    for start in range(0, len(batches), device_iterations):
        losses += [float(v) for v in several(batches[start:start + device_iterations])]
    return losses
