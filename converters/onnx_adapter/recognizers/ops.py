"""A native ONNX normalization node: an op of the standard domain that is a kind's KindInfo.onnx_op."""

from __future__ import annotations

from typing import Any

from schemas.kinds import KIND_INFO

from ...recognizers.base import ObjectRecognizer
from ..proto import DEFAULT_DOMAINS

#: Native op -> kind.
OP_KINDS = {info.onnx_op: kind for kind, info in KIND_INFO.items() if info.onnx_op is not None}


class OnnxOps(ObjectRecognizer):
    """An onnx.NodeProto of a native normalization op."""

    name = "onnx.ops"
    framework = "onnx"

    def kind_of(self, obj: Any) -> str | None:
        if getattr(obj, "domain", None) not in DEFAULT_DOMAINS:
            return None
        return OP_KINDS.get(getattr(obj, "op_type", None))


RECOGNIZER = OnnxOps()
