"""Facts of the ONNX format every reader here needs: the default domains, the float types, a model's opset."""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (NumPy's bfloat16, which onnx's numpy_helper maps to BFLOAT16)
import onnx

#: Domains of the standard operator set ("" and its long name).
DEFAULT_DOMAINS = ("", "ai.onnx")
#: TensorProto element type -> spec dtype, for the float types a normalization computes in.
FLOAT_TYPES = {
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
}


def opset_of(model: onnx.ModelProto) -> int:
    """The default-domain opset a model imports (0 when it imports none)."""
    return max((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), default=0)
