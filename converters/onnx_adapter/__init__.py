"""ONNX adapter: onnx.ModelProto graphs holding one normalization layer <-> NormSpec, and whole ONNX graphs.

Each kind has its own module; `layer_graph`, `reading`, `metadata` and `decompositions`
hold what they share. Models run in onnxruntime (CPU) for `check`. Whole graphs: `model`
(the model adapter), `graph/` (finding every normalization, rewriting decompositions),
`running` (serving in onnxruntime), `statistics` (BatchNorm inputs, recalibration).
"""

from .batch import OnnxBatchNorm
from .files import load_onnx, save_onnx
from .framework import OnnxFramework
from .group import OnnxGroupNorm
from .instance import OnnxInstanceNorm
from .layer import OnnxLayerNorm
from .model import OnnxModelAdapter
from .rms import OnnxRMSNorm

FRAMEWORK = OnnxFramework()
MODEL = OnnxModelAdapter()

KIND_ADAPTERS = {
    "batch": OnnxBatchNorm,
    "layer": OnnxLayerNorm,
    "rms": OnnxRMSNorm,
    "group": OnnxGroupNorm,
    "instance": OnnxInstanceNorm,
}

__all__ = ["FRAMEWORK", "KIND_ADAPTERS", "MODEL", "OnnxFramework", "load_onnx", "save_onnx"]
