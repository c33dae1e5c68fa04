"""tf2onnx's BatchNormalization folded into a per-channel Mul and Add.

eps is gone; only the node names, which keep TF's `batchnorm/` scope, say it was one (or, in the
rewrite, the source model's statistics: onnx_adapter.graph.rewrite pairs them by their folded constants).
"""

from __future__ import annotations

from ...recognizers.base import GraphRecognizer
from ..graph.channels import match_folded_by_name


class OnnxFoldedBatchNorm(GraphRecognizer):
    """A Mul and Add under TF's `batchnorm/` name scope."""

    name = "onnx.folded_batchnorm"
    framework = "onnx"

    def find(self, index, claimed: set[int]) -> list:
        matches = []
        for i in range(len(index.nodes)):
            match = match_folded_by_name(index, i, claimed)
            if match is not None:
                claimed.update(match.nodes)
                matches.append(match)
        return matches


RECOGNIZER = OnnxFoldedBatchNorm()
