"""Every normalization in an ONNX graph, native or decomposed, as a `Match`: what the graph recognizers find.

The recognizers (converters/recognizers/, framework "onnx") are asked in their registered order,
each reporting only what it can read exactly and claiming the nodes it reports, so that a later,
less specific one never reads part of an earlier match: torch.onnx's grouped InstanceNormalization,
the statistics decompositions read algebraically, native nodes, and tf2onnx's BatchNorm folded
into a Mul and an Add.
"""

from __future__ import annotations

from ... import recognizers
from .index import GraphIndex
from .match import Match

__all__ = ["Match", "find_matches"]


def find_matches(index: GraphIndex) -> list[Match]:
    """Every normalization in the graph, in graph order (each node in at most one match)."""
    claimed: set[int] = set()
    matches: list[Match] = []
    for recognizer in recognizers.RECOGNIZERS.of("onnx", recognizers.GraphRecognizer):
        matches.extend(recognizer.find(index, claimed))
    return sorted(matches, key=lambda m: (m.start, max(m.nodes)))
