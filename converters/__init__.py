"""normbridge converters: exact normalization-layer conversion among PyTorch, Keras 3 and ONNX.

    import converters
    spec = converters.to_spec(obj)               # torch.nn.Module | keras layer | onnx.ModelProto
    obj = converters.from_spec(spec, "keras")    # "torch" | "keras" | "onnx"
    obj = converters.convert(obj, to="onnx", opset=23)
    converters.write_layer(obj, spec, "onnx", "bn.onnx")  # spec folder, .onnx, .keras, torch safetensors
    report = converters.last_report()            # per-layer fidelity report (text and JSON)
    result = converters.check(spec_or_obj)       # round trips + numerics against a NumPy reference
    results = converters.check_many(specs)       # the same for many layers, each object built once per configuration
    converters.recognize(MyNorm, kind="rms", eps="variance_epsilon")  # a class of your own, proved per instance

Whole-model tools (inspect_model, port_state, export_for_serving, contract_test, drift_check,
recalibrate, monitor) are imported on first use, so `import converters` stays light.
"""

from importlib import import_module

from .api import convert, convert_with_report, from_spec, last_report, to_spec
from .equivalence import check
from .gate.grouped_check import check_many
from .layer_files import write_layer
from .options import ConversionOptions
from .adapters import REGISTRY
from .recognizers.declared import recognize

#: Lazily imported functions: name -> module in converters (the whole-model tools live in converters.models).
_MODEL_TOOLS = {
    "inspect_model": "models.inspection",
    "port_state": "models.porting",
    "export_for_serving": "models.serving.export",
    "contract_test": "models.serving.contract",
    "drift_check": "models.monitoring.drift",
    "recalibrate": "models.monitoring.recalibration",
    "monitor": "models.monitoring.collector",
    "onnx_upload_bytes": "onnx_adapter.external_data",
}


def __getattr__(name: str):
    if name in _MODEL_TOOLS:
        return getattr(import_module(f".{_MODEL_TOOLS[name]}", __name__), name)
    raise AttributeError(f"module 'converters' has no attribute '{name}'")


__all__ = [
    "ConversionOptions",
    "REGISTRY",
    "check",
    "check_many",
    "convert",
    "convert_with_report",
    "from_spec",
    "last_report",
    "recognize",
    "to_spec",
    "write_layer",
    *_MODEL_TOOLS,
]
