"""One execution plan (replicas, stages, accumulation, precision) from flags or one call."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

from keras_efficientnet.training.config import BACKENDS, PRECISIONS

# Split points may also fall before the head (head conv, pool, classifier).
EXTRA_SPLIT_POINTS = ("head",)


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, received {value!r}")


@dataclass(frozen=True)
class ExecutionPlan:
    """How one training step is laid out on devices.

    Args:
        backend: "default" (one device), "mirrored" (local GPUs or logical CPUs), "multiworker"
            (TF_CONFIG processes), "horovod" (horovodrun processes) or "ipu". Default "default".
        replicas: data-parallel copies of the model (all workers together). Default 1.
        pipeline_splits: block names that start a new pipeline stage, e.g. ("block4a",).
        auto_stages: when > 0, the planner chooses `auto_stages` stages once the model exists
            (see `resolve`); `pipeline_splits` must then be empty. Default 0.
        micro_batch_size: examples per replica per forward pass. Default 32.
        gradient_accumulation: micro-batches whose gradients add up to one update. Default 1.
        device_iterations: training steps per host call. Default 1.
        precision: "float32", "mixed_float16" or "mixed_bfloat16". Default "float32".
        stochastic_rounding: IPU only: None turns it on for 16-bit precisions. Default None.

    Example:
        >>> p = ExecutionPlan(replicas=8, pipeline_splits=("block4a",), micro_batch_size=3,
        ...                   gradient_accumulation=256)
        >>> p.global_batch_size, p.num_stages, p.devices_needed
        (6144, 2, 16)
    """

    backend: str = "default"
    replicas: int = 1
    pipeline_splits: tuple[str, ...] = ()
    auto_stages: int = 0
    micro_batch_size: int = 32
    gradient_accumulation: int = 1
    device_iterations: int = 1
    precision: str = "float32"
    stochastic_rounding: bool | None = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, received "
                             f"{self.backend!r}")
        for name in ("replicas", "micro_batch_size", "gradient_accumulation",
                     "device_iterations"):
            _positive_int(name, getattr(self, name))
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, received "
                             f"{self.precision!r}")
        splits = self.pipeline_splits
        if isinstance(splits, str):
            splits = tuple(s.strip() for s in splits.split(",") if s.strip())
        splits = tuple(splits)
        # Frozen dataclass: normalise the field once, here.
        object.__setattr__(self, "pipeline_splits", splits)
        if len(set(splits)) != len(splits):
            raise ValueError(f"pipeline_splits repeats a block: {list(splits)}")
        if not isinstance(self.auto_stages, int) or self.auto_stages < 0:
            raise ValueError(f"auto_stages must be an int >= 0, received {self.auto_stages!r}")
        if self.auto_stages and splits:
            raise ValueError(f"give either pipeline_splits {list(splits)} or auto_stages "
                             f"{self.auto_stages}, not both")
        if self.backend == "default" and self.replicas != 1:
            raise ValueError(f"backend 'default' runs one replica, received replicas="
                             f"{self.replicas}; use --backend=mirrored (one host) or "
                             "multiworker/horovod (several processes) for data parallelism")
        if self.num_stages > 1 and self.replicas > 1 and self.backend != "ipu":
            raise ValueError(
                f"pipeline stages ({self.num_stages}) together with replicas ({self.replicas}) "
                f"are supported only on the IPU backend, received backend {self.backend!r}; "
                "on TensorFlow devices use either --pipeline_splits or --replicas")

        if self.gradient_accumulation > 1 and self.backend in ("mirrored", "multiworker",
                                                               "horovod"):
            raise ValueError(
                f"gradient accumulation ({self.gradient_accumulation}) with backend "
                f"{self.backend!r} is not implemented on TensorFlow devices (only one device or "
                "the IPU backend accumulate); raise --micro_batch_size or --replicas instead, "
                "or use --gradient_accumulation=1")

    @property
    def num_stages(self) -> int:
        return self.auto_stages if self.auto_stages else len(self.pipeline_splits) + 1

    @property
    def pipelined(self) -> bool:
        return self.num_stages > 1

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer update: micro-batch x accumulation x replicas."""
        return self.micro_batch_size * self.gradient_accumulation * self.replicas

    @property
    def replica_batch_size(self) -> int:
        """Examples one replica sees per update (all its micro-batches)."""
        return self.micro_batch_size * self.gradient_accumulation

    @property
    def devices_needed(self) -> int:
        return self.replicas * self.num_stages

    @property
    def uses_stochastic_rounding(self) -> bool:
        if self.stochastic_rounding is not None:
            return bool(self.stochastic_rounding)
        return self.precision != "float32"

    def learning_rate(self, per_example: float) -> float:
        """Linear scaling: the peak learning rate for this plan's global batch."""
        return per_example * self.global_batch_size

    def check_model(self, model) -> None:
        """Checks the splits against `model.block_names`: known names, in forward order."""
        self.check_block_names(model.block_names, model.name)

    def check_block_names(self, block_names, model_name: str) -> None:
        """Checks the splits against a model's block names: known names, in forward order."""
        names = tuple(block_names) + EXTRA_SPLIT_POINTS
        for split in self.pipeline_splits:
            if split not in names:
                raise ValueError(
                    f"pipeline split {split!r} is not a block of {model_name}; valid split "
                    f"points: {list(names)} (fix: --pipeline_splits=<names from that list> or "
                    f"--pipeline_splits=auto:{self.num_stages})")
        order = [names.index(s) for s in self.pipeline_splits]
        if order != sorted(order):
            raise ValueError(f"pipeline_splits must follow the forward order of the blocks, "
                             f"received {list(self.pipeline_splits)}; "
                             f"use {[names[i] for i in sorted(order)]}")

    def check_devices(self, available: int, kind: str = "device") -> None:
        """Raises when the plan needs more devices than `available`."""
        if self.devices_needed > available:
            raise ValueError(
                f"the plan needs {self.devices_needed} {kind}s ({self.replicas} replicas x "
                f"{self.num_stages} pipeline stages) but {available} are available; reduce "
                "--replicas or the number of pipeline stages, or (CPU tests) ask for more "
                "logical CPU devices")

    def resolve(self, model) -> ExecutionPlan:
        """The plan with `auto_stages` replaced by the planner's splits, checked on `model`."""
        if self.auto_stages:
            from keras_efficientnet.distribute.planner import plan_splits

            splits = plan_splits(model, self.auto_stages).splits
            resolved = dataclasses.replace(self, auto_stages=0, pipeline_splits=splits)
        else:
            resolved = self
        resolved.check_model(model)
        return resolved

    def describe(self) -> str:
        """Printable summary, including the global batch the learning rate is scaled with."""
        if self.auto_stages:
            stages = f"{self.auto_stages} (chosen by the planner)"
        elif self.pipelined:
            stages = f"{self.num_stages}, split at {', '.join(self.pipeline_splits)}"
        else:
            stages = "1 (not pipelined)"
        return "\n".join([
            "Execution plan",
            f"  backend               {self.backend}",
            f"  replicas              {self.replicas}",
            f"  pipeline stages       {stages}",
            f"  micro-batch size      {self.micro_batch_size}",
            f"  gradient accumulation {self.gradient_accumulation}",
            f"  device iterations     {self.device_iterations}",
            f"  precision             {self.precision}"
            + (" (stochastic rounding)" if self.backend == "ipu"
               and self.uses_stochastic_rounding else ""),
            f"  devices               {self.devices_needed}",
            f"  global batch          {self.global_batch_size} = {self.micro_batch_size} "
            f"x {self.gradient_accumulation} x {self.replicas} "
            "(micro-batch x accumulation x replicas)",
        ])


def accumulation_for(global_batch_size: int, micro_batch_size: int, replicas: int) -> int:
    """The accumulation count that forms `global_batch_size`, or a ValueError saying why not."""
    for name, value in (("global_batch_size", global_batch_size),
                        ("micro_batch_size", micro_batch_size), ("replicas", replicas)):
        _positive_int(name, value)
    per_step = micro_batch_size * replicas
    if global_batch_size % per_step:
        lower = max(per_step, global_batch_size // per_step * per_step)
        raise ValueError(
            f"global batch {global_batch_size} cannot be formed from micro-batch "
            f"{micro_batch_size} x {replicas} replicas (it is not a multiple of {per_step}); "
            f"use a global batch of {lower} or {lower + per_step}, or change "
            "--micro_batch_size/--replicas")
    return global_batch_size // per_step


def parse_pipeline_splits(text: str) -> tuple[tuple[str, ...], int]:
    """"block4a,block6a" -> ((names), 0); "auto:N" -> ((), N); "" -> ((), 0)."""
    text = (text or "").strip()
    if text.startswith("auto:"):
        count = text[len("auto:"):]
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--pipeline_splits=auto:N needs a positive stage count N, "
                             f"received {text!r}")
        return (), int(count) if int(count) > 1 else 0
    return tuple(s.strip() for s in text.split(",") if s.strip()), 0


def plan_from_flags_dict(values: dict[str, Any]) -> ExecutionPlan:
    """Builds the plan from flag values (the CLI passes `{name: FLAGS[name].value}`).

    Keys: backend, replicas, pipeline_splits (comma-separated block names or "auto:N"),
    micro_batch_size, gradient_accumulation, device_iterations, precision; optional
    global_batch_size (> 0 derives the accumulation, which must then be absent or agree) and
    stochastic_rounding. Missing keys take the ExecutionPlan defaults; unknown keys are ignored.
    """
    kwargs = {f.name: values[f.name] for f in dataclasses.fields(ExecutionPlan)
              if f.name in values and f.name not in ("pipeline_splits", "auto_stages")}
    if "pipeline_splits" in values:
        splits = values["pipeline_splits"]
        if isinstance(splits, (list, tuple)):
            splits = ",".join(splits)
        kwargs["pipeline_splits"], kwargs["auto_stages"] = parse_pipeline_splits(splits)
    global_batch = values.get("global_batch_size") or 0
    if global_batch:
        accumulation = accumulation_for(int(global_batch),
                                        kwargs.get("micro_batch_size", 32),
                                        kwargs.get("replicas", 1))
        given = kwargs.get("gradient_accumulation")
        if given not in (None, 1, accumulation):
            raise ValueError(
                f"global batch {global_batch} needs gradient accumulation {accumulation} with "
                f"micro-batch {kwargs.get('micro_batch_size', 32)} x "
                f"{kwargs.get('replicas', 1)} replicas, but --gradient_accumulation={given}; "
                "give one of the two")
        kwargs["gradient_accumulation"] = accumulation
    return ExecutionPlan(**kwargs)


class Runtime:
    """A plan bound to its strategy: what `plan(...)` returns to notebooks and the trainer.

    `scope()` is the strategy scope to build the model and optimizer in; `wrap(model)` returns
    the model to train (a `PipelinedModel` when pipelined or accumulating, else the model);
    `train_step(model, optimizer, loss)` a compiled step for the backend; `distribute(x, y)`
    cuts one global batch into this process's per-replica pieces for that step.

    The trainer (`training.train_and_evaluate(config, runtime)`) uses the rest: `attach(model)`
    checks the plan on the built model, `fit(model, data, ...)` trains with Keras' `fit` where
    it works (one device, mirrored, IPU) and with the project's own loop where it does not
    (multi-worker, horovod, pipeline stages), and `is_chief` says whether this process writes
    checkpoints and results.
    """

    def __init__(self, plan: ExecutionPlan, strategy=None, *, devices=None):
        self.plan = plan
        self._strategy = strategy
        self._devices = devices

    @property
    def strategy(self):
        if self._strategy is None:
            from keras_efficientnet.distribute.strategies import build_strategy

            self._strategy = build_strategy(self.plan)
        return self._strategy

    def scope(self):
        if self.plan.backend in ("default", "horovod") and self._strategy is None:
            return contextlib.nullcontext()
        return self.strategy.scope()

    def describe(self) -> str:
        return self.plan.describe()

    def apply_precision(self) -> None:
        """Sets Keras' global dtype policy to the plan's precision (before building the model).

        With "mixed_float16", wrap the optimizer in `keras.optimizers.LossScaleOptimizer`; the
        train steps scale the loss through `optimizer.scale_loss`.
        """
        import keras

        keras.mixed_precision.set_global_policy(self.plan.precision)

    def configure_devices(self) -> list[str]:
        """On a host without GPUs, splits the CPU into the devices the plan needs.

        Mirrored replicas and pipeline stages each need a device; with no GPU they run on
        logical CPU devices (which share the cores: a functional run, not a speed-up). Call it
        first thing in the process, before TensorFlow initialises its devices.
        """
        import tensorflow as tf

        wants_devices = self.plan.backend == "mirrored" or (
            self.plan.backend == "default" and self.plan.pipelined)
        if not wants_devices or tf.config.list_physical_devices("GPU"):
            return []
        from keras_efficientnet.distribute.strategies import configure_logical_cpus

        return configure_logical_cpus(self.plan.devices_needed)

    def start(self) -> None:
        """Starts the backend now, so that a missing package, an unreachable peer or a device
        count that does not fit fails before any work (and, for multi-worker, before other
        TensorFlow ops, as MultiWorkerMirroredStrategy requires)."""
        if self.plan.backend == "horovod":
            size = self._horovod().size()
            if size != self.plan.replicas:
                raise ValueError(f"--replicas={self.plan.replicas} but horovodrun started "
                                 f"{size} processes; pass --replicas equal to horovodrun's -np")
        elif self.plan.backend != "default":
            self.strategy  # noqa: B018 - builds (and checks) the strategy now
        elif self.plan.pipelined and self._devices is None:
            from keras_efficientnet.distribute.pipeline import stage_devices

            self._devices = stage_devices(self.plan.num_stages)  # one device per stage

    @property
    def is_chief(self) -> bool:
        """Whether this process writes checkpoints, logs and results (worker 0 / rank 0)."""
        if self.plan.backend == "multiworker":
            from keras_efficientnet.distribute.strategies import read_tf_config

            task = read_tf_config()["task"]
            return task.get("type", "worker") == "chief" or (
                task.get("type", "worker") == "worker" and int(task["index"]) == 0)
        if self.plan.backend == "horovod":
            return self._horovod().rank() == 0
        return True

    @property
    def one_device(self) -> bool:
        """Whether the model lives on one device (no strategy), so Keras can evaluate it."""
        return self.plan.backend == "default"

    @property
    def owns_loop(self) -> bool:
        """True where Keras' `fit` cannot run the plan and the project's loop trains instead."""
        return self.plan.backend in ("multiworker", "horovod") or self.plan.pipelined

    @property
    def accumulates_in_step(self) -> bool:
        """True when one step takes all micro-batches of an update (the pipelined step), so the
        data comes in replica batches and the optimizer does not accumulate itself."""
        return self.plan.pipelined and self.plan.backend != "ipu"

    def _horovod(self):
        from keras_efficientnet.distribute.train_loop import import_horovod

        hvd = import_horovod()
        hvd.init()  # idempotent
        return hvd

    def attach(self, model) -> None:
        """Checks the plan on the built model and prepares it: resolves `auto:N` splits and
        prints each stage's share, and on the IPU
        assigns pipeline stages and accumulation to the model (before `compile`)."""
        self.plan = self.plan.resolve(model)
        if self.plan.pipelined:
            from keras_efficientnet.distribute.planner import describe_splits

            print(describe_splits(model, self.plan.pipeline_splits).describe(), flush=True)
        if self.plan.backend == "ipu":
            from keras_efficientnet.distribute.ipu import apply_plan

            apply_plan(model, self.plan)

    def wrap(self, model):
        """The trainable form of `model` under this plan (checks splits, devices, BatchNorm)."""
        self.plan = self.plan.resolve(model)
        if self.plan.backend == "ipu":
            return model  # stages and accumulation are set on the model by `ipu.apply_plan`.
        if self.plan.pipelined or self.plan.gradient_accumulation > 1:
            from keras_efficientnet.distribute.pipeline import PipelinedModel

            return PipelinedModel(model, self.plan.pipeline_splits,
                                  micro_batches=self.plan.gradient_accumulation,
                                  devices=self._devices)
        return model

    def train_step(self, model, optimizer, loss):
        """A compiled step `step(x, y) -> loss` for this plan's backend."""
        from keras_efficientnet.distribute import train_loop
        from keras_efficientnet.distribute.pipeline import PipelinedModel

        if isinstance(model, PipelinedModel):
            return model.make_train_step(optimizer, loss)
        if self.plan.backend == "horovod":
            return train_loop.make_horovod_train_step(model, optimizer, loss,
                                                      hvd=self._horovod())
        return train_loop.make_train_step(model, optimizer, loss,
                                          global_batch_size=self.plan.global_batch_size,
                                          strategy=self.strategy)

    def distribute(self, x, y):
        """This process's share of one global batch, in the form `train_step` takes."""
        from keras_efficientnet.distribute.train_loop import distribute_batch

        if self.plan.backend == "horovod":
            hvd = self._horovod()
            size = int(x.shape[0]) // hvd.size()
            start = hvd.rank() * size
            return x[start:start + size], y[start:start + size]
        if self.plan.backend in ("default", "ipu"):
            return x, y
        return distribute_batch(self.strategy, x, y)

    def fit(self, model, data, *, epochs: int, steps_per_epoch: int, initial_epoch: int = 0,
            callbacks=(), verbose: int = 1):
        """Trains a compiled `model` on `data` (global batches); returns its History.

        Keras' `fit` where it works; otherwise the project's loop with the same callbacks,
        `model.optimizer` and `model.loss` (Keras 3 `fit` fails under
        MultiWorkerMirroredStrategy, keras#20585; horovod's Keras integration assumes tf.keras;
        pipeline stages need their own step).
        """
        if not self.owns_loop:
            return model.fit(data, epochs=epochs, initial_epoch=initial_epoch,
                             steps_per_epoch=steps_per_epoch, callbacks=list(callbacks),
                             shuffle=False, verbose=verbose)
        from keras_efficientnet.distribute import train_loop

        step = self.train_step(self.wrap(model), model.optimizer, model.loss)
        if self.plan.backend == "horovod":
            # Same start everywhere: rank 0's weights and optimizer state (e.g. after resume).
            train_loop.broadcast_variables([*model.variables, *model.optimizer.variables],
                                           self._horovod())
        return train_loop.fit(model, step, data, distribute=self.distribute, epochs=epochs,
                              steps_per_epoch=steps_per_epoch, initial_epoch=initial_epoch,
                              device_iterations=self.plan.device_iterations,
                              callbacks=callbacks, verbose=verbose)


def runtime_for(config) -> Runtime:
    """The runtime of a `training.TrainConfig`'s execution fields (backend, replicas, ...).

    Split names are checked against the preset's blocks here, before any model is built.
    """
    from keras_efficientnet.models.efficientnet import SCALING, block_specs
    from keras_efficientnet.models.presets import preset_config

    execution_plan = plan_from_flags_dict(config.to_dict())
    scaling = SCALING[preset_config(config.model)["variant"]]
    names = [spec.name for spec in block_specs(scaling.width, scaling.depth)]
    execution_plan.check_block_names(names, config.model)
    return Runtime(execution_plan)


def run(config, *, print_plan: bool = True) -> dict:
    """Trains and evaluates `config` under its execution plan: what the CLI runs.

    Builds and checks the plan (bad input fails here, before any work), splits the CPU into
    logical devices where the plan needs them and there is no GPU, prints the plan with its
    global batch, then runs `training.train_and_evaluate(config, runtime)`.
    """
    from keras_efficientnet.training.trainer import train_and_evaluate

    runtime = runtime_for(config)
    devices = runtime.configure_devices()
    runtime.start()
    if print_plan:
        print(runtime.describe(), flush=True)
        if devices:
            print(f"  (no GPU: {len(devices)} logical CPU devices share this host's cores)",
                  flush=True)
    return train_and_evaluate(config, runtime=runtime)


def plan(backend: str = "default", *, replicas: int = 1, pipeline_splits=(),
         micro_batch_size: int = 32, gradient_accumulation: int = 1, device_iterations: int = 1,
         precision: str = "float32", global_batch_size: int | None = None,
         print_plan: bool = True) -> Runtime:
    """One-call entry for notebooks: the plan, validated and printed, bound to its strategy.

    A 16-bit `precision` also sets Keras' global dtype policy (see `Runtime.apply_precision`).
    `pipeline_splits` takes block names (tuple or comma-separated string) or "auto:N".

    Example:
        >>> rt = ke.distribute.plan("mirrored", replicas=2, micro_batch_size=8)
        >>> with rt.scope():
        ...     model = rt.wrap(ke.EfficientNet("tiny", classes=4))
    """
    values = dict(backend=backend, replicas=replicas, pipeline_splits=pipeline_splits,
                  micro_batch_size=micro_batch_size, device_iterations=device_iterations,
                  precision=precision, global_batch_size=global_batch_size)
    if not global_batch_size or gradient_accumulation != 1:
        values["gradient_accumulation"] = gradient_accumulation
    execution_plan = plan_from_flags_dict(values)
    if print_plan:
        print(execution_plan.describe())
    runtime = Runtime(execution_plan)
    if precision != "float32":
        runtime.apply_precision()
    return runtime
