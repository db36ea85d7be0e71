"""GPipe-style pipeline: an EfficientNet cut into stage models on their own devices."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_efficientnet.distribute import train_loop
from keras_efficientnet.distribute.devices import local_devices
from keras_efficientnet.distribute.planner import resolve_splits
from keras_efficientnet.training.plan import ExecutionPlan, check_splits
from keras_efficientnet.training.runtime import RuntimeBase, first_step, skip_seen


def _all_layers(layers) -> list[keras.Layer]:
    # Blocks keep their sublayers in `ordered_layers` (MBConvBlock): walk them too.
    found = []
    for layer in layers:
        found.append(layer)
        found += _all_layers(getattr(layer, "ordered_layers", None) or ())
    return found


def batch_norm_layers(model: keras.Model) -> list[str]:
    """Paths of the BatchNormalization layers anywhere inside `model` (blocks included)."""
    return [layer.path for layer in _all_layers(model.layers)
            if isinstance(layer, keras.layers.BatchNormalization)]


def split_model(model: keras.Model, splits: tuple[str, ...]) -> list[keras.Model]:
    """Stage models that share `model`'s layers (and weights), cut before each block in `splits`.

    The EfficientNet graph is a chain ("stem", "block1a", ..., "head"), so each stage is that
    chain's layers re-applied to a new input of the boundary's shape.
    """
    check_splits(splits, model.block_names, model.name)
    groups: list[list[keras.Layer]] = [[]]
    for unit, layers in model.block_layers().items():
        if unit in splits:
            groups.append([])
        groups[-1].extend(layers)
    stages = []
    for index, layers in enumerate(groups):
        boundary = layers[0].input
        inputs = keras.Input(tuple(boundary.shape[1:]), dtype=boundary.dtype,
                             name=f"stage{index}_input")
        x = inputs
        for layer in layers:
            x = layer(x)
        stages.append(keras.Model(inputs, x, name=f"{model.name}_stage{index}"))
    return stages


class PipelinedModel:
    """A model cut into pipeline stages, trained with micro-batches (GPipe, Huang et al. 2019).

    The global batch is cut into `micro_batches` pieces. Inside one `tf.function` every
    micro-batch goes forward through the stages (each under its own `tf.device`), then backward
    in reverse, and the gradients add up to one update. TensorFlow's executor runs any op whose
    inputs are ready, so stage s works on micro-batch m while stage s+1 works on m-1: the GPipe
    schedule comes from the data flow, not from explicit scheduling. With one stage this is plain
    gradient accumulation.

    BatchNorm: each micro-batch is normalised with its own statistics (and moving averages are
    updated once per micro-batch), so the step equals gradient accumulation over the same
    micro-batches on the unsplit model, not the full-batch step. That is refused unless
    `allow_batch_norm=True`; batch-independent norms (group/layer) reproduce the full batch.

    Args:
        model: an `EfficientNet` (anything with `block_names` and `block_layers()`).
        splits: block names that start stages 1, 2, ...; () for one stage.
        micro_batches: micro-batches per step (the plan's gradient accumulation). Default 1.
        devices: one device name per stage; None picks GPUs or logical CPUs.
        allow_batch_norm: accept per-micro-batch BatchNorm statistics. Default False.

    Example:
        >>> pipe = PipelinedModel(model, ("block4a",), micro_batches=4)
        >>> step = pipe.make_train_step(keras.optimizers.SGD(0.1), "categorical_crossentropy")
        >>> loss = step(images, labels)
    """

    def __init__(self, model: keras.Model, splits: tuple[str, ...] = (), *,
                 micro_batches: int = 1, devices: list[str] | None = None,
                 allow_batch_norm: bool = False):
        if not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"micro_batches must be a positive int, received {micro_batches!r}")
        norms = batch_norm_layers(model)
        if norms and not allow_batch_norm:
            raise ValueError(
                f"{model.name} has {len(norms)} BatchNormalization layers (e.g. {norms[0]}); "
                f"a pipelined or accumulated step ({micro_batches} micro-batches) normalises "
                "each micro-batch with its own statistics and does not reproduce the "
                "full-batch step. Use a batch-independent norm (norm='group' or 'layer'), or "
                "pass allow_batch_norm=True to accept per-micro-batch statistics")
        self.model = model
        self.splits = tuple(splits)
        self.micro_batches = micro_batches
        self.stages = split_model(model, self.splits)
        self.devices = (list(devices) if devices is not None
                        else local_devices(len(self.stages), "pipeline stages"))
        if len(self.devices) != len(self.stages):
            raise ValueError(f"need one device per stage ({len(self.stages)}), received "
                             f"{self.devices}")

    @property
    def trainable_variables(self):
        return self.model.trainable_variables

    def __call__(self, x, training: bool = False):
        for stage, device in zip(self.stages, self.devices):
            with tf.device(device):
                x = stage(x, training=training)
        return x

    def compute_gradients(self, x, y, loss, global_batch_size: int | None = None,
                          scale_loss=None):
        """(summed loss, gradients in `model.trainable_variables` order) of one global batch.

        Each example's loss is divided by `global_batch_size` (default: this batch's size), so
        the result is the gradient of the batch-mean loss, as for the unsplit model.
        `scale_loss` (e.g. a LossScaleOptimizer's) scales each micro-batch's loss before the
        backward pass; the returned loss is unscaled.
        """
        loss_fn = train_loop.per_example_loss(loss)
        batch = x.shape[0]
        if batch is None or batch % self.micro_batches:
            raise ValueError(f"batch of {batch} examples cannot be cut into "
                             f"{self.micro_batches} equal micro-batches")
        scale = float(global_batch_size or batch)
        xs = tf.split(x, self.micro_batches)
        ys = tf.split(y, self.micro_batches)
        last = len(self.stages) - 1
        records = []
        total = tf.constant(0.0)
        for m in range(self.micro_batches):
            h, record = xs[m], []
            for s, (stage, device) in enumerate(zip(self.stages, self.devices)):
                with tf.device(device):
                    tape = tf.GradientTape()
                    with tape:
                        if s > 0:
                            tape.watch(h)
                        out = stage(h, training=True)
                        if s == last:
                            out = tf.reduce_sum(loss_fn(ys[m], tf.cast(out, tf.float32))) / scale
                            total += out
                            if scale_loss is not None:
                                out = scale_loss(out)
                record.append((tape, h, out))
                h = out
            records.append(record)
        index = {id(v): i for i, v in enumerate(self.model.trainable_variables)}
        grads: list = [None] * len(index)
        # Backward in reverse micro-batch order, as GPipe; each stage's gradient runs on its device.
        for m in reversed(range(self.micro_batches)):
            upstream = None
            for s in reversed(range(len(self.stages))):
                stage, device = self.stages[s], self.devices[s]
                tape, h, out = records[m][s]
                variables = stage.trainable_variables
                sources = list(variables) + ([h] if s > 0 else [])
                with tf.device(device):
                    result = tape.gradient(out, sources, output_gradients=upstream,
                                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
                    for v, g in zip(variables, result[:len(variables)]):
                        i = index[id(v)]
                        grads[i] = g if grads[i] is None else grads[i] + g
                upstream = result[-1] if s > 0 else None
        return total, grads

    def make_train_step(self, optimizer: keras.optimizers.Optimizer, loss,
                        global_batch_size: int | None = None):
        """A `tf.function` step(x, y) -> loss: pipelined gradients, one optimizer update."""
        variables = self.model.trainable_variables
        optimizer.build(variables)

        def step(x, y):
            value, grads = self.compute_gradients(x, y, loss, global_batch_size,
                                                  scale_loss=optimizer.scale_loss)
            optimizer.apply(grads, variables)
            return value

        return tf.function(step, jit_compile=False)


class PipelinedRuntime(RuntimeBase):
    """The default strategy with pipeline stages: one device per stage, GPipe steps.

    Each step takes all micro-batches of one update (`PipelinedModel`) and the project's loop
    runs it; the model itself lives on one device, so Keras evaluates it in place.

    Args:
        plan: an `ExecutionPlan` with strategy "default" and 2 or more stages.
        devices: one device name per stage; None: the local GPUs, else logical CPU devices.
    """

    def __init__(self, plan: ExecutionPlan, devices: list[str] | None = None):
        self.plan = plan
        self.devices = devices

    def start(self) -> None:
        if self.devices is None:
            self.devices = local_devices(self.plan.num_stages, "pipeline stages")

    def attach(self, model: keras.Model) -> None:
        self.plan = resolve_splits(self.plan, model)

    def fit(self, model, make_dataset, *, epochs, step_calls_per_epoch, initial_epoch=0,
            start_step=None, callbacks=(), verbose=1, watch=None):
        pipe = PipelinedModel(model, self.plan.pipeline_splits,
                              micro_batches=self.plan.micro_batches_per_step_call,
                              devices=self.devices)
        step = pipe.make_train_step(model.optimizer, model.loss)
        data = skip_seen(make_dataset(None),
                         first_step(initial_epoch, step_calls_per_epoch, start_step))
        return train_loop.fit(model, step, data, epochs=epochs,
                              step_calls_per_epoch=step_calls_per_epoch,
                              initial_epoch=initial_epoch,
                              step_calls_per_execution=self.plan.step_calls_per_execution,
                              callbacks=callbacks, verbose=verbose)
