"""ONNX adapter: onnx.ModelProto graphs holding one normalization layer <-> NormSpec.

Each kind has its own module; `graph`, `reading`, `metadata` and `decompositions`
hold what they share. Models run in onnxruntime (CPU) for `check`.
"""

from .batch import OnnxBatchNorm
from .files import load_onnx, save_onnx
from .framework import OnnxFramework
from .group import OnnxGroupNorm
from .instance import OnnxInstanceNorm
from .layer import OnnxLayerNorm
from .rms import OnnxRMSNorm

FRAMEWORK = OnnxFramework()

KIND_ADAPTERS = {
    "batch": OnnxBatchNorm,
    "layer": OnnxLayerNorm,
    "rms": OnnxRMSNorm,
    "group": OnnxGroupNorm,
    "instance": OnnxInstanceNorm,
}

__all__ = ["FRAMEWORK", "KIND_ADAPTERS", "OnnxFramework", "load_onnx", "save_onnx"]
