"""Native normalization nodes in a whole graph (the ones no decomposition claimed)."""

from __future__ import annotations

from schemas.floats import shortest_float32_decimal
from schemas.kinds import KIND_INFO

from ...recognizers.base import GraphRecognizer
from ..graph.index import GraphIndex, attribute
from ..graph.match import Match
from .ops import RECOGNIZER as OPS


def match_native(index: GraphIndex, i: int) -> Match | None:
    """The Match of node `i` when it is a native normalization node."""
    node = index.nodes[i]
    kind = OPS.kind_of(node)
    if kind is None or not node.input or not node.output:
        return None
    eps = attribute(node, "epsilon", KIND_INFO[kind].default_eps["onnx"])
    training = attribute(node, "training_mode", 0) == 1  # BatchNormalization's; the other ops have no mode
    return Match(
        kind=kind,
        native=True,
        origin="native",
        name=node.name or node.output[0],
        nodes=[i],
        input=node.input[0],
        output=node.output[0],
        eps=shortest_float32_decimal(eps),
        dtype=index.dtype(node.input[0]),
        rank=index.rank(node.input[0]),
        training_mode=training,
    )


class OnnxNativeNodes(GraphRecognizer):
    """Every unclaimed native node, in graph order."""

    name = "onnx.native_nodes"
    framework = "onnx"

    def find(self, index, claimed: set[int]) -> list:
        matches = []
        for i in range(len(index.nodes)):
            if i in claimed:
                continue
            match = match_native(index, i)
            if match is not None:
                claimed.add(i)
                matches.append(match)
        return matches


RECOGNIZER = OnnxNativeNodes()
