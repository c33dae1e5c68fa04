"""torch.onnx's (and normbridge's) GroupNorm below opset 21: Reshape to (N, G, -1), InstanceNormalization with unit
scale, Reshape back, per-channel Mul and Add."""

from __future__ import annotations

from schemas.kinds import KIND_INFO

from ...recognizers.base import GraphRecognizer
from ..graph.channels import match_grouped_instance_norm


class OnnxGroupedInstanceNorm(GraphRecognizer):
    """Asked first: its InstanceNormalization would otherwise be read alone as an InstanceNorm."""

    name = "onnx.grouped_instance_norm"
    framework = "onnx"

    def find(self, index, claimed: set[int]) -> list:
        matches = []
        for i, node in enumerate(index.nodes):
            if node.op_type == KIND_INFO["instance"].onnx_op and index.default_domain(i):
                match = match_grouped_instance_norm(index, i, claimed)
                if match is not None:
                    claimed.update(match.nodes)
                    matches.append(match)
        return matches


RECOGNIZER = OnnxGroupedInstanceNorm()
