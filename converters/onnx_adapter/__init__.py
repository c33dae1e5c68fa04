"""ONNX adapter: onnx.ModelProto graphs holding one normalization layer <-> NormSpec, and whole ONNX graphs.

Each kind has its own module; `layer_graph`, `reading`, `metadata` and `decompositions`
hold what they share. Models run in onnxruntime (CPU) for `check`. Whole graphs: `model`
(the model adapter), `graph/` (finding every normalization, rewriting decompositions),
`running` (serving in onnxruntime), `statistics` (BatchNorm inputs, recalibration).
"""

from ..adapter import kind_adapters
from .files import load_onnx, save_onnx
from .framework import OnnxFramework
from .model import OnnxModelAdapter

FRAMEWORK = OnnxFramework()
MODEL = OnnxModelAdapter()

#: kind -> KindAdapter class: the ADAPTER of each module named after a kind (onnx_adapter/<kind>.py).
KIND_ADAPTERS = kind_adapters(__name__)

__all__ = ["FRAMEWORK", "KIND_ADAPTERS", "MODEL", "OnnxFramework", "load_onnx", "save_onnx"]
