"""The execution plan as a value: replicas, pipeline stages, accumulation, and its batch arithmetic.

Pure Python (no Keras, no TensorFlow): the config builds its plan from flags, the trainer derives
its batch sizes and step counts from it, and `keras_efficientnet.distribute` runs it. Everything
that multiplies micro-batches, accumulation and replicas lives here and nowhere else.

Units, each in the name of every count: an *update* is one optimizer update (the global batch,
`examples_per_update`); a *micro-batch* is what one replica takes in one forward pass; a *step
call* is one call of the training step (Keras' `fit` counts these as its steps); an *optimizer
apply* is one call of the optimizer's `apply` (Keras' accumulating optimizer applies once per
micro-batch and updates every `gradient_accumulation_steps` applies).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Strategy:
    """What the rest of the package needs to know about one `--strategy`.

    Args:
        runtime: (module, class) of its runtime behind `training.runtime.Runtime`.
        step_accumulates: the training step takes all micro-batches of an update and sums their
            gradients itself (else one micro-batch per step call).
        one_process: the run is one process, which owns the run directory from the start; the
            others learn which process is the chief only once the runtime has started.
        runtime_options: {runtime keyword: config field}, the config settings the runtime takes.
        signals_held_at_import: SIGTERM/SIGINT are blocked while TensorFlow loads, so that the
            start-up's watchdog (`distribute.watchdog`) sees them.
    """

    runtime: tuple[str, str]
    step_accumulates: bool = False
    one_process: bool = True
    runtime_options: Mapping[str, str] = field(default_factory=dict)
    signals_held_at_import: bool = False


_DISTRIBUTE = "keras_efficientnet.distribute"
# The one table of strategies, as `models.presets.FAMILIES` is for architectures. "default" is
# one device; with pipeline stages it runs `PIPELINED_RUNTIME` (one device per stage).
STRATEGY_TABLE: Mapping[str, Strategy] = {
    "default": Strategy(("keras_efficientnet.training.runtime", "OneDevice")),
    "mirrored": Strategy((f"{_DISTRIBUTE}.mirrored", "MirroredRuntime"),
                         step_accumulates=True),
    "multiworker": Strategy((f"{_DISTRIBUTE}.multiworker", "MultiWorkerRuntime"),
                            step_accumulates=True, one_process=False,
                            runtime_options={"timeout": "peer_timeout"},
                            signals_held_at_import=True),
    "horovod": Strategy((f"{_DISTRIBUTE}.horovod", "HorovodRuntime"), step_accumulates=True,
                        one_process=False),
    "ipu": Strategy((f"{_DISTRIBUTE}.ipu", "IPURuntime")),
}
PIPELINED_RUNTIME = (f"{_DISTRIBUTE}.pipeline", "PipelinedRuntime")
STRATEGIES = tuple(STRATEGY_TABLE)
# "float16" keeps the weights in float16 too: Graphcore's "16.16" (stochastic rounding on the
# IPU); "mixed_float16" is their "16.32".
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16", "float16")
# --stochastic_rounding: "auto" leaves it to the precision (on for 16-bit).
STOCHASTIC_ROUNDING = {"auto": None, "on": True, "off": False}
# Split points may also fall before the head (head conv, pool, classifier).
EXTRA_SPLIT_POINTS = ("head",)


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, received {value!r}")


@dataclass(frozen=True)
class ExecutionPlan:
    """How one training step is laid out on devices, and what that means for batches and steps.

    Args:
        strategy: "default" (one device), "mirrored" (local GPUs or logical CPUs),
            "multiworker" (TF_CONFIG processes), "horovod" (horovodrun processes) or "ipu".
            Default "default".
        replicas: data-parallel copies of the model (all workers together). Default 1.
        pipeline_splits: block names that start a new pipeline stage, e.g. ("block4a",).
        auto_stages: when > 0, the planner chooses `auto_stages` stages once the model exists;
            `pipeline_splits` must then be empty. Default 0.
        micro_batch_size: examples per replica per forward pass. Default 32.
        gradient_accumulation: micro-batches whose gradients make one update. Default 1.
        device_iterations: optimizer updates per host call (Graphcore's and PopTorch's meaning).
            Default 1.
        precision: "float32", "mixed_float16", "mixed_bfloat16" or "float16". Default
            "float32".
        stochastic_rounding: IPU only: None turns it on for 16-bit precisions. Default None.

    Who accumulates: on one device Keras' optimizer (`optimizer_applies_per_update`), one
    micro-batch per step call; with replicas or pipeline stages the project's step, all
    micro-batches of an update per step call; on the IPU Graphcore's pipelining or
    accumulation options.

    Example:
        >>> p = ExecutionPlan(replicas=8, pipeline_splits=("block4a",), micro_batch_size=3,
        ...                   gradient_accumulation=256, strategy="ipu")
        >>> p.examples_per_update, p.num_stages, p.devices_needed, p.examples_per_step_call
        (6144, 2, 16, 24)
    """

    strategy: str = "default"
    replicas: int = 1
    pipeline_splits: tuple[str, ...] = ()
    auto_stages: int = 0
    micro_batch_size: int = 32
    gradient_accumulation: int = 1
    device_iterations: int = 1
    precision: str = "float32"
    stochastic_rounding: bool | None = None

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"--strategy must be one of {list(STRATEGIES)}, received "
                             f"{self.strategy!r}")
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
        if self.strategy == "default" and self.replicas != 1:
            raise ValueError(f"--strategy=default runs one replica, received --replicas="
                             f"{self.replicas}; use --strategy=mirrored (one host) or "
                             "multiworker/horovod (several processes) for data parallelism")
        if self.pipelined and self.replicas > 1 and self.strategy != "ipu":
            raise ValueError(
                f"pipeline stages ({self.num_stages}) together with replicas ({self.replicas}) "
                f"run only with --strategy=ipu, received --strategy={self.strategy}; on "
                "TensorFlow devices use either --pipeline_splits or --replicas (with "
                "--gradient_accumulation to keep the global batch)")
        if self.pipelined and STRATEGY_TABLE[self.strategy].step_accumulates:
            raise ValueError(
                f"--pipeline_splits with --strategy={self.strategy} is not supported: "
                "pipeline stages on TensorFlow devices run with --strategy=default (one "
                "device per stage) and --replicas=1")

    # ------------------------------------------------------------------ layout

    @property
    def num_stages(self) -> int:
        return self.auto_stages if self.auto_stages else len(self.pipeline_splits) + 1

    @property
    def pipelined(self) -> bool:
        return self.num_stages > 1

    @property
    def devices_needed(self) -> int:
        return self.replicas * self.num_stages

    @property
    def uses_stochastic_rounding(self) -> bool:
        if self.stochastic_rounding is not None:
            return bool(self.stochastic_rounding)
        return self.precision != "float32"

    # ------------------------------------------------------------------ batch arithmetic

    @property
    def examples_per_update(self) -> int:
        """Examples per optimizer update: micro-batch x accumulation x replicas."""
        return self.micro_batch_size * self.gradient_accumulation * self.replicas

    @property
    def global_batch_size(self) -> int:
        """The flag's name of `examples_per_update` (what the learning rate is scaled by)."""
        return self.examples_per_update

    @property
    def micro_batches_per_update(self) -> int:
        """Micro-batches of one replica whose gradients make one update (the flag
        --gradient_accumulation)."""
        return self.gradient_accumulation

    @property
    def step_accumulates(self) -> bool:
        """Whether one step call takes all micro-batches of an update (replicas, pipeline
        stages) rather than one."""
        return STRATEGY_TABLE[self.strategy].step_accumulates or (
            self.strategy == "default" and self.pipelined)

    @property
    def micro_batches_per_step_call(self) -> int:
        """Micro-batches one replica takes in one step call."""
        return self.micro_batches_per_update if self.step_accumulates else 1

    @property
    def optimizer_applies_per_update(self) -> int:
        """Calls of the optimizer's `apply` per update: Keras' optimizer accumulates them
        itself only on one unsplit device.

        Everywhere else the step (or Graphcore's pipelining and accumulation options) already
        sums the micro-batches; the optimizer accumulating too would multiply the update's batch.
        """
        if self.strategy == "default" and not self.pipelined:
            return self.micro_batches_per_update
        return 1

    @property
    def step_calls_per_update(self) -> int:
        """Calls of the training step per optimizer update."""
        return self.micro_batches_per_update // self.micro_batches_per_step_call

    @property
    def examples_per_step_call(self) -> int:
        """Examples all replicas together take in one step call (one training batch)."""
        return self.micro_batch_size * self.micro_batches_per_step_call * self.replicas

    @property
    def examples_per_forward_pass(self) -> int:
        """Examples one forward pass of every replica takes: the evaluation batch."""
        return self.micro_batch_size * self.replicas

    @property
    def updates_per_execution(self) -> int:
        """Optimizer updates per host call (the flag --device_iterations)."""
        return self.device_iterations

    @property
    def step_calls_per_execution(self) -> int:
        """Step calls per host call (Keras' and Graphcore's `steps_per_execution`).

        `updates_per_execution` updates of `step_calls_per_update` step calls each, so it is
        always a multiple of the accumulation count where a step call is one micro-batch, as
        Graphcore requires.
        """
        return self.updates_per_execution * self.step_calls_per_update

    def updates_per_epoch(self, train_examples: int, requested: int = 0) -> int:
        """Optimizer updates per epoch: `requested` (--updates_per_epoch), else one pass over
        `train_examples`.

        On the IPU it is rounded down to whole host calls (Graphcore requires each replica's
        steps per epoch to be a multiple of `steps_per_execution`).
        """
        updates = requested or train_examples // self.examples_per_update
        if updates < 1:
            raise ValueError(
                f"an epoch of {train_examples} examples cannot form one optimizer update of "
                f"{self.examples_per_update} examples ({self.describe_global_batch()}); lower "
                "--micro_batch_size, --gradient_accumulation or --replicas, or set "
                "--updates_per_epoch")
        if self.strategy == "ipu":
            whole = updates - updates % self.updates_per_execution
            if whole < 1:
                raise ValueError(
                    f"an epoch of {updates} updates holds no whole host call of "
                    f"--device_iterations={self.device_iterations} updates; lower "
                    "--device_iterations")
            updates = whole
        return updates

    def step_calls_per_epoch(self, updates: int) -> int:
        """Training-step calls in an epoch of `updates` updates (what `fit` and the project's
        loop count as steps)."""
        return updates * self.step_calls_per_update

    def optimizer_applies_per_epoch(self, updates: int) -> int:
        """Calls of the optimizer's `apply` in an epoch of `updates` updates: the unit of the
        learning-rate schedule (Keras' accumulating optimizer counts every micro-batch)."""
        return updates * self.optimizer_applies_per_update

    def with_examples_per_update(self, examples: int, flag: str) -> ExecutionPlan:
        """This plan with the accumulation that makes updates of `examples` (the fine-tune's
        plan: micro-batch, replicas, strategy and stages stay); a ValueError naming `flag` when
        `examples` is not a multiple of micro-batch x replicas."""
        micro_batches = _micro_batches_for(examples, self.micro_batch_size, self.replicas, flag,
                                           "an update accumulates micro-batches")
        return dataclasses.replace(self, gradient_accumulation=micro_batches)

    # ------------------------------------------------------------------ checks and text

    def check_block_names(self, block_names: Sequence[str], model_name: str) -> None:
        """Checks the splits against a model's block names: known names, in forward order."""
        check_splits(self.pipeline_splits, block_names, model_name, self.num_stages)

    def check_devices(self, available: int, kind: str = "device") -> None:
        """Raises when the plan needs more devices than `available`."""
        if self.devices_needed > available:
            raise ValueError(
                f"the plan needs {self.devices_needed} {kind}s ({self.replicas} replicas x "
                f"{self.num_stages} pipeline stages) but {available} are available; reduce "
                "--replicas or the number of pipeline stages, or (CPU tests) ask for more "
                "logical CPU devices")

    def describe_global_batch(self) -> str:
        return (f"{self.global_batch_size} = {self.micro_batch_size} x "
                f"{self.gradient_accumulation} x {self.replicas} "
                "(micro-batch x accumulation x replicas)")

    def describe(self) -> str:
        """The plan as text, including the global batch the learning rate is scaled with."""
        if self.auto_stages:
            stages = f"{self.auto_stages} (chosen by the planner)"
        elif self.pipelined:
            stages = f"{self.num_stages}, split at {', '.join(self.pipeline_splits)}"
        else:
            stages = "1 (not pipelined)"
        rounding = (" (stochastic rounding)" if self.strategy == "ipu"
                    and self.uses_stochastic_rounding else "")
        return "\n".join([
            "Execution plan",
            f"  strategy              {self.strategy}",
            f"  replicas              {self.replicas}",
            f"  pipeline stages       {stages}",
            f"  micro-batch size      {self.micro_batch_size}",
            f"  gradient accumulation {self.gradient_accumulation}",
            f"  device iterations     {self.device_iterations} updates per host call",
            f"  precision             {self.precision}{rounding}",
            f"  devices               {self.devices_needed}",
            f"  global batch          {self.describe_global_batch()}",
        ])


def check_splits(splits: Sequence[str], block_names: Sequence[str], model_name: str,
                 num_stages: int | None = None) -> None:
    """The one check of split names: each a block (or "head") of the model, in forward order."""
    names = tuple(block_names) + EXTRA_SPLIT_POINTS
    stages = num_stages or len(splits) + 1
    for split in splits:
        if split not in names:
            raise ValueError(
                f"pipeline split {split!r} is not a block of {model_name}; valid split "
                f"points: {list(names)} (fix: --pipeline_splits=<names from that list> or "
                f"--pipeline_splits=auto:{stages})")
    order = [names.index(s) for s in splits]
    if order != sorted(order):
        raise ValueError(f"pipeline_splits must follow the forward order of the blocks, "
                         f"received {list(splits)}; use {[names[i] for i in sorted(order)]}")


def _micro_batches_for(examples: int, micro_batch_size: int, replicas: int, flag: str,
                       remedy: str) -> int:
    """Micro-batches per replica that make `examples`, or a ValueError naming `flag`."""
    per_pass = micro_batch_size * replicas
    if examples % per_pass:
        lower = max(per_pass, examples // per_pass * per_pass)
        raise ValueError(
            f"{flag}={examples} must be a multiple of --micro_batch_size={micro_batch_size} x "
            f"--replicas={replicas} = {per_pass} ({remedy}); use {lower} or {lower + per_pass}")
    return examples // per_pass


def accumulation_for(global_batch_size: int, micro_batch_size: int, replicas: int,
                     given: int | None = None) -> int:
    """The accumulation count that forms `global_batch_size`, or a ValueError saying why not.

    `given` is an accumulation count the user set as well (None: not set); it must agree.
    """
    for name, value in (("global_batch_size", global_batch_size),
                        ("micro_batch_size", micro_batch_size), ("replicas", replicas)):
        _positive_int(name, value)
    accumulation = _micro_batches_for(global_batch_size, micro_batch_size, replicas,
                                      "--global_batch_size", "an update is micro-batch x "
                                      "accumulation x replicas")
    if given is not None and given != accumulation:
        raise ValueError(
            f"--global_batch_size={global_batch_size} needs --gradient_accumulation="
            f"{accumulation} with --micro_batch_size={micro_batch_size} x --replicas="
            f"{replicas}, but --gradient_accumulation={given}; give one of the two")
    return accumulation


def parse_pipeline_splits(text: str | Sequence[str]) -> tuple[tuple[str, ...], int]:
    """"block4a,block6a" -> ((names), 0); "auto:N" -> ((), N); "" -> ((), 0)."""
    if not isinstance(text, str):
        text = ",".join(text)
    text = text.strip()
    if text.startswith("auto:"):
        count = text[len("auto:"):]
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--pipeline_splits=auto:N needs a positive stage count N, "
                             f"received {text!r}")
        return (), int(count) if int(count) > 1 else 0
    return tuple(s.strip() for s in text.split(",") if s.strip()), 0


def plan_from_values(values: Mapping[str, Any]) -> ExecutionPlan:
    """The plan of flag-style values (a config's fields, or a notebook's keyword arguments).

    Keys: strategy, replicas, pipeline_splits (names, comma-separated, or "auto:N"),
    micro_batch_size, gradient_accumulation (None: not given), device_iterations, precision,
    stochastic_rounding (a bool, None, or the flag's "auto"/"on"/"off") and global_batch_size
    (> 0 derives the accumulation, which must then be absent or agree). Missing keys take the
    defaults; other keys are ignored.
    """
    fields = {f.name for f in dataclasses.fields(ExecutionPlan)} - {"pipeline_splits",
                                                                      "auto_stages"}
    kwargs = {k: values[k] for k in fields if values.get(k) is not None}
    if isinstance(kwargs.get("stochastic_rounding"), str):  # the flag: "auto", "on" or "off"
        kwargs["stochastic_rounding"] = STOCHASTIC_ROUNDING[kwargs["stochastic_rounding"]]
    if values.get("pipeline_splits"):
        kwargs["pipeline_splits"], kwargs["auto_stages"] = parse_pipeline_splits(
            values["pipeline_splits"])
    if values.get("global_batch_size"):
        kwargs["gradient_accumulation"] = accumulation_for(
            int(values["global_batch_size"]), kwargs.get("micro_batch_size", 32),
            kwargs.get("replicas", 1), values.get("gradient_accumulation"))
    return ExecutionPlan(**kwargs)
