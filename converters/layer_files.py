"""Writing one converted layer to disk, atomically: the one writer the CLI's `convert` and the registry's per-layer
export share.

The format follows the target and the path: `spec`, a spec folder (spec.json + tensors.safetensors);
`onnx`, the checked .onnx model; `keras`, a one-layer .keras model; `torch`, the module's state dict as
safetensors (with its class in the metadata), either alone in a file whose name ends in `.safetensors`
or as `state_dict.safetensors` in a folder beside the spec that says how to build the module.
A failed write leaves nothing half written.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from schemas import InputFileError, NormSpec, save_spec
from schemas.atomic_io import atomic_write_bytes, atomic_write_folder
from schemas.kinds import KIND_INFO

TARGETS = ("spec", "onnx", "keras", "torch")


def write_layer(obj: Any, spec: NormSpec, to: str, path: str | Path) -> Path:
    """Write `obj`, the layer `spec` converted to framework `to` (the spec itself for "spec"), to `path`;
    returns `path`."""
    path = Path(path)
    if to == "spec":
        atomic_write_folder(path, lambda folder: save_spec(spec, folder))
    elif to == "onnx":
        from .onnx_adapter.files import save_onnx

        save_onnx(obj, path)
    elif to == "keras":
        atomic_write_bytes(path, _keras_bytes(obj, spec))
    elif to == "torch":
        if path.suffix == ".safetensors":
            atomic_write_bytes(path, _torch_state(obj))
        else:
            atomic_write_folder(path, lambda folder: _torch_folder(obj, spec, folder))
    else:
        raise InputFileError(f"cannot write a layer as '{to}'; choose one of {', '.join(TARGETS)}.")
    return path


def keras_input_shape(spec: NormSpec) -> tuple:
    """Input shape (without batch) a Keras layer for `spec` accepts: unknown sizes except the normalised axes."""
    if KIND_INFO[spec.kind].trailing:
        rank = spec.input_rank or len(spec.normalized_shape) + 2
        return (None,) * (rank - 1 - len(spec.normalized_shape)) + tuple(spec.normalized_shape)
    rank = spec.input_rank or ((spec.spatial_rank or 2) + 2)
    if spec.layout == "channels_first":
        return (spec.num_features,) + (None,) * (rank - 2)
    return (None,) * (rank - 2) + (spec.num_features,)


def _keras_bytes(layer: Any, spec: NormSpec) -> bytes:
    from .api import read_spec
    from .keras_adapter.runtime import import_keras

    keras = import_keras()
    keras_spec, _ = read_spec(layer)
    model = keras.Sequential([keras.Input(shape=keras_input_shape(keras_spec), dtype=spec.dtype), layer])
    with tempfile.TemporaryDirectory() as folder:
        saved = Path(folder) / "layer.keras"
        model.save(saved)
        return saved.read_bytes()


def _torch_state(module: Any) -> bytes:
    from safetensors.torch import save

    state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    return save(state, metadata={"class": type(module).__name__})


def _torch_folder(module: Any, spec: NormSpec, folder: Path) -> None:
    """PyTorch output: the state dict as safetensors plus the spec that says how to build the module."""
    (folder / "state_dict.safetensors").write_bytes(_torch_state(module))
    save_spec(spec, folder)
