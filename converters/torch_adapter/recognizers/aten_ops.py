"""A normalization call in a torch.export graph: an aten op of a kind's KindInfo.aten_ops.

After run_decompositions() InstanceNorm runs as a batch op on a (1, N*C, ...) view; the module
that called it (nn_module_stack) tells the two apart.
"""

from __future__ import annotations

from typing import Any

from ...recognizers.base import ObjectRecognizer
from ..recognition.aten_calls import OP_KINDS, module_kind, module_of
from ..torch_internals import op_name


class TorchAtenOps(ObjectRecognizer):
    """A torch.fx Node calling a normalization aten op."""

    name = "torch.aten_ops"
    framework = "torch"

    def kind_of(self, obj: Any) -> str | None:
        if getattr(obj, "op", None) != "call_function":
            return None
        kind = OP_KINDS.get(op_name(obj))
        if kind == "batch" and module_kind(module_of(obj)[1]) == "instance":
            kind = "instance"  # run_decompositions runs InstanceNorm as a batch op on a (1, N*C, ...) view
        return kind


RECOGNIZER = TorchAtenOps()
