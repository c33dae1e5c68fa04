"""ONNX's facts (`FrameworkInfo`), read without importing onnx or onnxruntime."""

from ..framework_info import FrameworkInfo

INFO = FrameworkInfo(
    name="onnx",
    package="converters.onnx_adapter",
    default_eps_name="the ONNX op default",
    model_files={".onnx": ".onnx"},
    structure_format="onnx",
    structure_suffix=".onnx",
    mlflow_flavour="onnx",
    object_origin="native",
    format_origins={"onnx": "native"},
    layer_suffix=".onnx",
    empty_batch="writes NaN into them (onnxruntime, training_mode=1)",
    worker_packages=("onnx", "onnxruntime"),
)
