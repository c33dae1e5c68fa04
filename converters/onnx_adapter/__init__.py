"""ONNX adapter: onnx.ModelProto graphs holding one normalization layer <-> NormSpec, and whole ONNX graphs.

Each kind has its own module; `layer_graph`, `reading`, `metadata` and `decompositions`
hold what they share. Models run in onnxruntime (CPU) for `check`. Whole graphs: `model`
(the model adapter), `graph/` (finding every normalization, rewriting decompositions),
`running` (serving in onnxruntime), `statistics` (BatchNorm inputs, recalibration).
Importing this package does not import onnx: `INFO` (info.py) is read by the adapter registry at once, the rest on
first use.
"""

from ..adapter import kind_adapters
from .info import INFO


def __getattr__(name: str):
    # FRAMEWORK, MODEL and KIND_ADAPTERS (kind -> the ADAPTER of onnx_adapter/<kind>.py) are built on first use.
    if name in ("FRAMEWORK", "MODEL", "KIND_ADAPTERS"):
        from .framework import OnnxFramework
        from .model import OnnxModelAdapter

        globals().setdefault("FRAMEWORK", OnnxFramework())
        globals().setdefault("MODEL", OnnxModelAdapter())
        globals().setdefault("KIND_ADAPTERS", kind_adapters(__name__))
        return globals()[name]
    if name in ("load_onnx", "save_onnx"):
        from . import files

        return getattr(files, name)
    if name == "OnnxFramework":
        from .framework import OnnxFramework

        return OnnxFramework
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FRAMEWORK", "INFO", "KIND_ADAPTERS", "MODEL", "OnnxFramework", "load_onnx", "save_onnx"]
