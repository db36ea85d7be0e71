"""A small ONNX graph writer: nodes, constants and named values, then one `onnx.ModelProto`.

Plain NumPy until `model_proto`, which imports `onnx`: the exporter builds the whole graph
(folding weights into convolutions as it goes) before anything needs the package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ONNX TensorProto element types used here (onnx.TensorProto.FLOAT, UINT8, INT64).
FLOAT, UINT8, INT64 = 1, 2, 7


@dataclass
class Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, Any] = field(default_factory=dict)
    name: str = ""


class Graph:
    """Nodes in topological order and constants by name; `model_proto` writes them."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self._names: set[str] = set()

    def unique(self, hint: str) -> str:
        """`hint`, or `hint:N` with the first N that no other name has."""
        name, count = hint, 0
        while name in self._names:
            count += 1
            name = f"{hint}:{count}"
        self._names.add(name)
        return name

    def constant(self, array, hint: str, dtype: str = "float32") -> str:
        """The name of a new constant holding `array` (a copy, as `dtype`)."""
        name = self.unique(hint)
        self.constants[name] = np.array(array, dtype=dtype)
        return name

    def node(self, op: str, inputs: list[str], hint: str, **attributes) -> str:
        """Adds `op(inputs)` with one output and returns the output's name."""
        output = self.unique(hint)
        self.nodes.append(Node(op, list(inputs), [output], attributes, name=output))
        return output

    def model_proto(self, inputs: list[tuple[str, int, list]], outputs: list[tuple[str, int,
                                                                                    list]],
                    opset: int, name: str, doc: str = ""):
        """The `onnx.ModelProto`: `inputs` and `outputs` are (name, element type, shape with
        str for a symbolic dimension). Unused constants are left out."""
        import onnx
        from onnx import helper, numpy_helper

        used = {name for node in self.nodes for name in node.inputs}
        initializers = [numpy_helper.from_array(array, name)
                        for name, array in self.constants.items() if name in used]
        nodes = [helper.make_node(n.op, n.inputs, n.outputs, name=n.name, **n.attributes)
                 for n in self.nodes]
        graph = helper.make_graph(
            nodes, name,
            [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
            [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
            initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="keras-efficientnet", doc_string=doc)
        # The IR version of the opset, not the newest the installed package knows: older
        # runtimes refuse a newer IR even for ops they have.
        model.ir_version = min(onnx.IR_VERSION, _IR_FOR_OPSET.get(opset, onnx.IR_VERSION))
        onnx.checker.check_model(model)
        return model


# The IR version each opset came with (onnx/helper.py's VERSION_TABLE), for the opsets we write.
_IR_FOR_OPSET = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11}
