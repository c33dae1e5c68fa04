"""KerasModelAdapter: keras.Model networks (.keras files, loaded with safe_mode) as whole models."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from schemas import InputFileError, NormbridgeError, NormSpec, UnsupportedObjectError
from schemas.atomic_io import atomic_write_bytes

from ..api import layer_spec
from ..model_adapter import ModelAdapter
from ..model_values import InputSpec, ModelRunner, NormLayerRef
from . import onnx_export, porting, recalibration, serving_taps, statistics
from .artifact_contents import keras_contents
from .keras_file_checks import check_keras_file
from .structure import keras_file, keras_structure
from .inputs import pack_inputs
from .keras_internals import all_layers
from .standardization import standardization_hazards
from .unrecognised import unrecognised_hazards
from .runtime import import_keras


def _load_keras(path: Path) -> Any:
    keras = import_keras()
    # normbridge's own layers, registered on import, may be in a file it wrote: an unbiased BatchNorm,
    # a tracked InstanceNorm.
    from . import tracked_instance_normalization, unbiased_batch_normalization  # noqa: F401

    try:
        check_keras_file(path)  # before Keras builds a variable or reads a weight: what the file declares is bounded
        return keras.saving.load_model(str(path), safe_mode=True, compile=False)
    except NormbridgeError:
        raise
    except ValueError as error:
        if "safe_mode" in str(error) or "Lambda" in str(error):
            raise InputFileError(
                f"'{path}' holds code (a Lambda layer or a deserialised function), which safe_mode refuses to run; rebuild the model without it."
            ) from error
        raise InputFileError(f"'{path}' is not a loadable .keras file ({error}).") from error
    except Exception as error:
        raise InputFileError(f"'{path}' is not a loadable .keras file ({type(error).__name__}: {error}).") from error


def _flatten(value: Any) -> list:
    if isinstance(value, dict):
        return [a for v in value.values() for a in _flatten(v)]
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _flatten(v)]
    return [value]


def _layer_path(layer: Any, names: list[str]) -> str:
    """The layer's name, or its path inside the model ('transformer_layer_1/feedforward_layernorm') when another
    normalization layer has the same name: keras_hub's blocks each hold a 'feedforward_layernorm', and one name for two
    layers made export-layers overwrite a file and diff unable to say which block changed."""
    if names.count(layer.name) > 1 and getattr(layer, "path", None):
        return str(layer.path)
    return layer.name


class KerasModelAdapter(ModelAdapter):
    """Layers in the flattened layer order; the mode is chosen per call (training=False to serve)."""

    framework = "keras"
    walk_origin = "keras"
    serving_source = True

    def load(self, path: Path) -> Any:
        return _load_keras(path)

    def save(self, model: Any, path: Path) -> None:
        with tempfile.TemporaryDirectory() as folder:
            temporary = Path(folder) / path.name
            model.save(temporary)
            atomic_write_bytes(path, temporary.read_bytes())

    def structure_of(self, model: Any, tensors, source=None):
        return keras_structure(model, read_safely=source is not None)

    def model_file(self, parts, tensors) -> bytes:
        return keras_file(parts, tensors)

    # -- layers ----------------------------------------------------------------------------

    def norm_layers(self, model: Any) -> list[NormLayerRef]:
        from ..adapters import REGISTRY

        framework = REGISTRY.framework("keras")
        layers = all_layers(model) if isinstance(model, import_keras().layers.Layer) else [model]
        found = []
        for layer in layers:
            try:
                kind = framework.kind_of(layer)
            except UnsupportedObjectError:
                continue
            found.append((layer, kind))
        names = [layer.name for layer, _ in found]
        return [NormLayerRef(_layer_path(layer, names), layer, "keras", kind) for layer, kind in found]

    def layer_specs(self, model: Any, sample: Any = None) -> list[NormSpec]:
        return [layer_spec(ref) for ref in self.norm_layers(model)]

    def layer_spec(self, ref: NormLayerRef) -> NormSpec:
        return layer_spec(ref)

    def model_hazards(self, model: Any, found: int | None = None) -> list:
        return standardization_hazards(model) + unrecognised_hazards(model)

    def describe(self, model: Any) -> str:
        return f"keras '{model.name}'"

    def artifact_contents(self, model: Any):
        return keras_contents(model, self.norm_layers(model))

    # -- porting ---------------------------------------------------------------------------

    def port_targets(self, model: Any) -> list[NormLayerRef]:
        return self.norm_layers(model)

    def plan_port_write(self, fresh, target, path, report):
        return porting.plan_write(fresh, target, path, report)

    def snapshot(self, layer):
        return porting.snapshot(layer)

    def after_port(self, model: Any) -> None:
        porting.reset_compiled(model)

    # -- running and serving ---------------------------------------------------------------

    def input_specs(self, model: Any) -> list[InputSpec]:
        try:
            inputs = model.inputs
        except (AttributeError, ValueError) as error:
            raise UnsupportedObjectError(
                f"Keras model '{model.name}' has no defined inputs ({error}); build it with keras.Input or call it once."
            ) from error
        if not inputs:
            raise UnsupportedObjectError(
                f"Keras model '{model.name}' has no defined inputs; build it with keras.Input or call it once."
            )
        return [InputSpec(t.name, tuple(t.shape), np.dtype(t.dtype).name) for t in inputs]

    def source_runner(self, model: Any) -> ModelRunner:
        keras = import_keras()
        specs = self.input_specs(model)

        def run(arrays):
            return [
                keras.ops.convert_to_numpy(o) for o in _flatten(model(pack_inputs(model, list(arrays)), training=False))
            ]

        return ModelRunner(run, f"keras {type(model).__name__} '{model.name}' (training=False)", specs)

    def export_onnx(self, model: Any, sample: Any, opset: int):
        return onnx_export.export_onnx(model, sample, opset)

    def unfold_exported(self, exported: Any, model: Any, specs: list[NormSpec]):
        from ..onnx_adapter.graph.unfold import unfold_conv_batchnorms

        unfolded_model, unfolded = unfold_conv_batchnorms(exported, onnx_export.conv_batchnorms(model, specs))
        notes = (
            [
                f"{len(unfolded)} BatchNorm(s) that TF's grappler had folded into Conv kernels were unfolded with the source kernels"
            ]
            if unfolded
            else []
        )
        return unfolded_model, notes

    # -- BatchNorm statistics --------------------------------------------------------------

    def batchnorm_moments(self, model: Any, batches, train: bool = False):
        if train:
            raise UnsupportedObjectError(
                "train-mode statistics of Keras models are not collected; recalibrate the torch or ONNX model."
            )
        return statistics.batchnorm_moments(model, batches)

    def recalibrate(self, model: Any, batches, variance_estimator: str):
        return recalibration.recalibrate_keras(model, batches, variance_estimator)

    # -- serving -------------------------------------------------------------------------------

    def serving_taps(self, model: Any, sink):
        """A wrapper that serves the model, sampled calls through a sub-model returning the BatchNormalization inputs
        too."""
        refs = [
            ref
            for ref in self.norm_layers(model)
            if ref.kind == "batch" and getattr(ref.obj, "moving_mean", None) is not None
        ]
        if not refs:
            raise UnsupportedObjectError(
                f"{self.describe(model)} has no BatchNormalization for the recognizers to find; nothing to monitor."
            )
        return serving_taps.keras_taps(model, refs, sink)
