"""A normalization call in a torch.export graph: an aten op of a kind's KindInfo.aten_ops.

After run_decompositions() InstanceNorm runs as a batch op on a (1, N*C, ...) view; the module
that called it (nn_module_stack) tells the two apart.
"""

from __future__ import annotations

from typing import Any

from schemas.kinds import KIND_INFO

from .base import ObjectRecognizer

#: aten op (schema name) -> kind.
OP_KINDS: dict[str, str] = {op: kind for kind, info in KIND_INFO.items() for op in info.aten_ops}


class TorchAtenOps(ObjectRecognizer):
    """A torch.fx Node calling a normalization aten op."""

    name = "torch.aten_ops"
    framework = "torch"

    def kind_of(self, obj: Any) -> str | None:
        schema = getattr(getattr(obj, "target", None), "_schema", None)
        if getattr(obj, "op", None) != "call_function" or schema is None or schema.name not in OP_KINDS:
            return None
        from ..torch_adapter.exported_program import module_kind, module_of

        kind = OP_KINDS[schema.name]
        if kind == "batch" and module_kind(module_of(obj)[1]) == "instance":
            kind = "instance"  # run_decompositions runs InstanceNorm as a batch op on a (1, N*C, ...) view
        return kind


RECOGNIZER = TorchAtenOps()
