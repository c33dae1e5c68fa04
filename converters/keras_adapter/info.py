"""Keras's facts (`FrameworkInfo`), read without importing Keras or TensorFlow."""

from ..framework_info import FrameworkInfo

INFO = FrameworkInfo(
    name="keras",
    package="converters.keras_adapter",
    default_eps_name="Keras's default",
    model_files={".keras": ".keras"},
    structure_format="keras",
    structure_suffix=".keras",
    archive=("a .keras file", "save the model with model.save('model.keras')"),
    mlflow_flavour="keras",
    object_origin="keras",
    format_origins={"keras": "keras"},
    layer_suffix=".keras",  # a one-layer model
    empty_batch="writes NaN into them",
    worker_packages=("keras", "tensorflow"),
)
