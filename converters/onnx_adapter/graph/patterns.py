"""Pattern matchers: every normalization in an ONNX graph, native or decomposed, as a `Match`.

Four matchers, each reporting only what it can read exactly:

- native nodes (BatchNormalization, LayerNormalization, GroupNormalization, InstanceNormalization,
  RMSNormalization);
- statistics decompositions (`moments`): from each tensor X that a ReduceMean or
  GlobalAveragePool reads, the subgraph is read with `algebra` and reported when
  it computes (X - mean) / sqrt(var + eps) * g + b or X / sqrt(mean(X^2) + eps) * g. This covers
  torch.onnx's RMSNorm (below opset 23), tf2onnx's LayerNormalization, RMSNormalization and
  GroupNormalization (the last after a Reshape that splits the channels into groups) and
  normbridge's own decompositions;
- torch.onnx's (and normbridge's) GroupNorm below opset 21: Reshape to (N, G, -1),
  InstanceNormalization with unit scale, Reshape back, per-channel Mul and Add;
- tf2onnx's BatchNormalization, folded into a per-channel Mul and Add (eps is gone; only the
  node names, which keep TF's `batchnorm/` scope, or the source model's statistics say it was one).
"""

from __future__ import annotations

from schemas.floats import shortest_float32_decimal
from schemas.kinds import KIND_INFO

from .channels import (
    folded_candidate,
    match_folded_by_name,
    match_grouped_instance_norm,
)
from .index import GraphIndex, attribute
from .match import Match
from .moments import match_moments, statistic_root

NATIVE_KINDS = {info.onnx_op: kind for kind, info in KIND_INFO.items()}

__all__ = ["Match", "find_matches", "folded_candidate"]


def match_native(index: GraphIndex, i: int) -> Match | None:
    node = index.nodes[i]
    if node.op_type not in NATIVE_KINDS or not index.default_domain(i) or not node.input or not node.output:
        return None
    kind = NATIVE_KINDS[node.op_type]
    eps = attribute(node, "epsilon", KIND_INFO[kind].default_eps["onnx"])
    training = attribute(node, "training_mode", 0) == 1  # BatchNormalization's; the other ops have no mode
    return Match(
        kind=kind, native=True, origin="native", name=node.name or node.output[0], nodes=[i],
        input=node.input[0], output=node.output[0], eps=shortest_float32_decimal(eps), dtype=index.dtype(node.input[0]),
        rank=index.rank(node.input[0]), training_mode=training,
    )


# -- all together ---------------------------------------------------------------------------


def find_matches(index: GraphIndex) -> list[Match]:
    """Every normalization in the graph, decompositions first (they may contain native nodes), in graph order."""
    claimed: set[int] = set()
    matches: list[Match] = []
    for i, node in enumerate(index.nodes):
        if node.op_type == KIND_INFO["instance"].onnx_op and index.default_domain(i):
            match = match_grouped_instance_norm(index, i, claimed)
            if match is not None:
                claimed.update(match.nodes)
                matches.append(match)
    roots = []
    for i, node in enumerate(index.nodes):
        if node.op_type in ("ReduceMean", "GlobalAveragePool") and index.default_domain(i) and node.input:
            root = statistic_root(index, node.input[0])
            if root not in roots:
                roots.append(root)
    for root in roots:
        matches.extend(match_moments(index, root, claimed))
    for i in range(len(index.nodes)):
        if i in claimed:
            continue
        match = match_native(index, i)
        if match is not None:
            claimed.add(i)
            matches.append(match)
    for i in range(len(index.nodes)):
        match = match_folded_by_name(index, i, claimed)
        if match is not None:
            claimed.update(match.nodes)
            matches.append(match)
    return sorted(matches, key=lambda m: (m.start, max(m.nodes)))
