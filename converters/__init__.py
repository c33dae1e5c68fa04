"""normbridge converters: exact normalization-layer conversion among PyTorch, Keras 3 and ONNX.

    import converters
    spec = converters.to_spec(obj)               # torch.nn.Module | keras layer | onnx.ModelProto
    obj = converters.from_spec(spec, "keras")    # "torch" | "keras" | "onnx"
    obj = converters.convert(obj, to="onnx", opset=23)
    report = converters.last_report()            # per-layer fidelity report (text and JSON)
    result = converters.check(spec_or_obj)       # round trips + numerics against a NumPy reference
"""

from .api import convert, convert_with_report, from_spec, last_report, to_spec
from .equivalence import check
from .options import ConversionOptions
from .registry import REGISTRY

__all__ = ["ConversionOptions", "REGISTRY", "check", "convert", "convert_with_report", "from_spec", "last_report", "to_spec"]
