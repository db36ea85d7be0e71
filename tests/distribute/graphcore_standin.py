"""A stand-in for Graphcore's IPU API that enforces its constraints, so a wrong mapping fails.

Modelled on Graphcore's sources (read, not copied): graphcore/tensorflow
`tensorflow/python/ipu/` (`config.IPUConfig`, `ipu_strategy.IPUStrategy`,
`gradient_accumulation.GradientAccumulationReductionMethod`) and graphcore/keras r2.6
`keras/ipu/extensions/` (`extensions_base.py`, `functional_extensions.py`, `data_adapter.py`):

- The pipelining and accumulation methods exist only on models of Graphcore's Keras 2.6 fork:
  `FunctionalModel` here; a Keras 3 model gets none of them.
- `set_pipeline_stage_assignment` takes one assignment per layer call (inputs excluded), each
  assigned, stages 0..N-1 without gaps, no layer reading a later stage's output.
- A pipelined model must have `set_pipelining_options(gradient_accumulation_steps_per_replica)`.
- `fit`: `steps_per_execution` must be divisible by the accumulation count (RuntimeError);
  `steps_per_epoch` counts the batches of all replicas, each replica runs
  steps_per_epoch // replicas steps, which must be divisible by `steps_per_execution`
  (ValueError); dataset shapes must be fully defined; replicas = attached IPUs // (stages
  rounded up to a power of two); Graphcore reports the effective batch as dataset batch x
  accumulation x replicas.
- Accumulation reduces by "sum" unless told "mean" or "running_mean".
- Calling a pipelined model ignores its stage assignment ("ignored when using the call()
  function"): Graphcore runs it unpipelined without a word; this stand-in, being strict, raises.
- Graphcore wraps the compiled optimizer in its own accumulation; an optimizer that also
  accumulates makes each update span accumulation x its own count micro-batches: strict, raises.

Everything the mapping asks for is written to a `Record`, which the tests compare with the plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types

import keras


class StandInError(RuntimeError):
    """What the strict stand-in raises where real Graphcore would silently do something else."""


REDUCTIONS = ("SUM", "MEAN", "RUNNING_MEAN")


def parse_reduction(method) -> str:
    key = str(method).upper()
    if key not in REDUCTIONS:
        raise ValueError(f"Cannot parse {method} as one of GradientAccumulationReductionMethod. "
                         f"Valid values are: {', '.join(REDUCTIONS)}.")
    return key


@dataclasses.dataclass
class Record:
    """What was asked of the stand-in, and what Graphcore would train with."""

    calls: list = dataclasses.field(default_factory=list)
    ipus: int | None = None
    esr: object = None
    recompute: bool = False
    stages: dict | None = None
    accumulation: int = 1
    reduction: str = "SUM"
    steps_per_execution: int = 1
    replicas: int | None = None
    dataset_batch: int | None = None
    steps_per_replica: int | None = None
    micro_batches_per_update: int | None = None
    effective_batch: int | None = None
    gradient_scale: float | None = None


def ipu_module(record: Record):
    """The stand-in of `tensorflow.python.ipu` (config and strategy)."""

    class IPUConfig:
        def __init__(self):
            self.auto_select_ipus = None
            self.allow_recompute = False
            self.floating_point_behaviour = types.SimpleNamespace(esr=None)
            record.calls.append("IPUConfig")

        def configure_ipu_system(self):
            if not isinstance(self.auto_select_ipus, int) or self.auto_select_ipus < 1:
                raise ValueError(f"auto_select_ipus must be a positive int, received "
                                 f"{self.auto_select_ipus!r}")
            record.calls.append("configure_ipu_system")
            record.ipus = self.auto_select_ipus
            record.esr = self.floating_point_behaviour.esr
            record.recompute = self.allow_recompute

    class IPUStrategy:
        def __init__(self):
            if record.ipus is None:
                raise RuntimeError("IPUStrategy needs a configured IPU system "
                                   "(IPUConfig.configure_ipu_system)")
            record.calls.append("IPUStrategy")

        def scope(self):
            return contextlib.nullcontext()

    return types.SimpleNamespace(
        config=types.SimpleNamespace(
            IPUConfig=IPUConfig,
            StochasticRoundingBehaviour=types.SimpleNamespace(ON="ON", OFF="OFF")),
        ipu_strategy=types.SimpleNamespace(IPUStrategy=IPUStrategy))


class Assignment:
    """Graphcore's FunctionalLayerPipelineStageAssignment: one call of one layer."""

    def __init__(self, layer, node_index: int = 0, pipeline_stage: int | None = None):
        self.layer = layer
        self.node_index = node_index
        self.pipeline_stage = pipeline_stage


class FunctionalModel:
    """A Functional model of Graphcore's Keras fork, over the layer graph of a Keras 3 model.

    The layers, their calls (in execution order) and their inbound layers come from the
    Keras 3 model; the IPU extension's methods are the stand-in's, with Graphcore's checks.
    """

    def __init__(self, keras_model, record: Record, *, strict: bool = True):
        self._keras = keras_model
        self.record = record
        self.strict = strict
        self.name = keras_model.name
        self.block_names = keras_model.block_names
        # (layer, names of the layers it reads) in execution order. EfficientNet's top level
        # is a chain (residuals live inside the blocks): each layer is called once and reads
        # the one before it.
        self._calls = []
        previous = []
        for layer in keras_model.layers:
            if isinstance(layer, keras.layers.InputLayer):
                continue
            self._calls.append((layer, previous))
            previous = [layer.name]
        self._assignment: list[Assignment] = []
        self._pipeline_accumulation = None
        self._accumulation = None
        self.optimizer = None
        self.loss = None
        self.stop_training = False

    # The parts of the Keras model a trainer reads.
    @property
    def trainable_variables(self):
        return self._keras.trainable_variables

    @property
    def losses(self):
        return self._keras.losses

    def block_layers(self):
        return self._keras.block_layers()

    # ------------------------------------------------ Graphcore's IPU extension

    def get_pipeline_stage_assignment(self):
        if self._assignment:
            return list(self._assignment)
        return [Assignment(layer) for layer, _ in self._calls]

    def set_pipeline_stage_assignment(self, assignments):
        if not isinstance(assignments, list):
            raise ValueError("`pipeline_stage_assignment` needs to be a list")
        if len(assignments) != len(self._calls):
            raise ValueError(f"The size of the provided `pipeline_stage_assignment` "
                             f"({len(assignments)}) does not match the total number of "
                             f"invocations of layers in the model (currently "
                             f"{len(self._calls)}).")
        if not all(isinstance(a, Assignment) for a in assignments):
            raise ValueError("All elements of `pipeline_stage_assignment` need to be "
                             "instances of `FunctionalLayerPipelineStageAssignment`.")
        stage_of = {}
        for a in assignments:
            if a.pipeline_stage is None:
                raise ValueError(f"Layer {a.layer.name} with node index {a.node_index} has not "
                                 "been assigned a pipeline stage.")
            if a.layer.name in stage_of:
                raise ValueError(f"Duplicate assignment for layer {a.layer.name} with node "
                                 f"index {a.node_index}.")
            stage_of[a.layer.name] = a.pipeline_stage
        found = sorted(set(stage_of.values()))
        if found != list(range(found[-1] + 1)):
            raise ValueError(f"Pipeline stages in the graph need to be strictly increasing, "
                             f"found pipeline stages {found}.")
        for layer, inbound in self._calls:
            for name in inbound:
                if name in stage_of and stage_of[name] > stage_of[layer.name]:
                    raise ValueError(
                        f"Layer {layer.name} in pipeline stage {stage_of[layer.name]} has a "
                        "dependency from a pipeline stage which has not yet executed.")
        self._assignment = list(assignments)
        self.record.calls.append("set_pipeline_stage_assignment")
        self.record.stages = stage_of

    def set_pipelining_options(self, gradient_accumulation_steps_per_replica=None,
                               device_mapping=None, accumulate_outfeed=None,
                               gradient_accumulation_reduction_method="sum", **kwargs):
        self._check_count(gradient_accumulation_steps_per_replica)
        self.record.reduction = parse_reduction(gradient_accumulation_reduction_method)
        self._pipeline_accumulation = gradient_accumulation_steps_per_replica
        self.record.calls.append("set_pipelining_options")

    def set_gradient_accumulation_options(self, gradient_accumulation_steps_per_replica=None,
                                          gradient_accumulation_reduction_method="sum",
                                          **kwargs):
        self._check_count(gradient_accumulation_steps_per_replica)
        self.record.reduction = parse_reduction(gradient_accumulation_reduction_method)
        self._accumulation = gradient_accumulation_steps_per_replica
        self.record.calls.append("set_gradient_accumulation_options")

    @staticmethod
    def _check_count(count):
        if count is not None and (not isinstance(count, int) or count < 1):
            raise ValueError(f"Expected `gradient_accumulation_steps_per_replica` to be a "
                             f"positive integer, but got {count} instead.")

    # ------------------------------------------------ Keras' API, as Graphcore's fork runs it

    def compile(self, optimizer=None, loss=None, metrics=None, steps_per_execution=None,
                **kwargs):
        self.optimizer, self.loss = optimizer, loss
        self.record.steps_per_execution = steps_per_execution or 1
        self.record.calls.append("compile")

    def __call__(self, x, training=False):
        if self._assignment and self.strict:
            raise StandInError(
                f"{self.name} is pipelined, but calling it ignores the pipeline stage "
                "assignment (Graphcore: it 'is ignored when using the call() function'): "
                "train through fit()")
        return self._keras(x, training=training)

    def _accumulation_count(self) -> int:
        if self._assignment:
            if self._pipeline_accumulation is None:
                raise ValueError(
                    "The model which you are attempting to train is pipelined, however "
                    "`gradient_accumulation_steps_per_replica` has not been set through "
                    "`set_pipelining_options()`.")
            return self._pipeline_accumulation
        return self._accumulation or 1

    def fit(self, x=None, epochs=1, steps_per_epoch=None, initial_epoch=0, callbacks=None,
            verbose=1, **kwargs):
        record = self.record
        if record.ipus is None:
            raise ValueError("Model can only be used on an IPU device: build it in IPUStrategy")
        accumulation = self._accumulation_count()
        steps_per_execution = record.steps_per_execution
        if steps_per_execution % accumulation:
            raise RuntimeError(
                f"The model has been configured to use gradient accumulation for training, "
                f"however the current `steps_per_execution` value (set to "
                f"{steps_per_execution}) is not divisible by "
                f"`gradient_accumulation_steps_per_replica` ({accumulation}).")
        stages = (max(record.stages.values()) + 1) if self._assignment else 1
        shard = 2 ** math.ceil(math.log2(stages))
        if shard > record.ipus:
            raise ValueError(f"Current device has {record.ipus} IPUs attached, however the "
                             f"current model requires a multiple of {shard} IPUs.")
        replicas = record.ipus // shard
        if steps_per_epoch is None:
            raise ValueError("Could not infer the size of the data. You must specify the "
                             "number of steps to run.")
        per_replica = steps_per_epoch // replicas
        if per_replica == 0 or per_replica % steps_per_execution:
            raise ValueError("`steps_per_execution` must be a divisor of the number of batches "
                             "in the dataset provided to this replica.")
        spec = x.element_spec[0]
        if not spec.shape.is_fully_defined():
            raise ValueError(f"The provided set of data contains a shape {spec.shape} which "
                             "is not fully defined.")
        optimizer_own = getattr(self.optimizer, "gradient_accumulation_steps", None) or 1
        if optimizer_own > 1 and self.strict:
            raise StandInError(
                f"the compiled optimizer accumulates {optimizer_own} steps itself, and "
                f"Graphcore accumulates {accumulation} more around it: gradients would be "
                f"accumulated twice ({optimizer_own * accumulation} micro-batches per update)")
        record.replicas = replicas
        record.accumulation = accumulation
        record.dataset_batch = int(spec.shape[0])
        record.steps_per_replica = per_replica
        record.micro_batches_per_update = accumulation * optimizer_own
        record.effective_batch = record.dataset_batch * accumulation * replicas
        record.gradient_scale = float(accumulation) if record.reduction == "SUM" else 1.0
        record.calls.append("fit")
        return record
