"""Statistics decompositions read algebraically: LayerNorm, RMSNorm, GroupNorm and InstanceNorm written as moments.

From each tensor X that a ReduceMean or GlobalAveragePool reads, the subgraph is read with
`onnx_adapter.graph.forms` and reported when it computes (X - mean) / sqrt(var + eps) * g + b or
X / sqrt(mean(X^2) + eps) * g. This covers torch.onnx's RMSNorm (below opset 23), tf2onnx's
LayerNormalization, RMSNormalization and GroupNormalization (the last after a Reshape that splits
the channels into groups), normbridge's own decompositions, and ONNX's own function bodies of
LayerNormalization (in a Flatten view), RMSNormalization and GroupNormalization (`graph/views.py`).
"""

from __future__ import annotations

from ...recognizers.base import GraphRecognizer
from ..graph.moments import match_moments, statistic_root


class OnnxMoments(GraphRecognizer):
    """Every exact moments decomposition, from the tensors a mean is taken of, in graph order."""

    name = "onnx.moments"
    framework = "onnx"

    def find(self, index, claimed: set[int]) -> list:
        roots = []
        for i, node in enumerate(index.nodes):
            if node.op_type in ("ReduceMean", "GlobalAveragePool") and index.default_domain(i) and node.input:
                root = statistic_root(index, node.input[0])
                if root not in roots:
                    roots.append(root)
        return [match for root in roots for match in match_moments(index, root, claimed)]


RECOGNIZER = OnnxMoments()
