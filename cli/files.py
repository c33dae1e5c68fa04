"""Reading a layer from disk and writing a converted one, atomically and without executing code.

Accepted inputs: a spec folder (spec.json + tensors.safetensors) or an .onnx file with one
normalization layer. Outputs are written to a temporary sibling and renamed into place,
so a failed conversion leaves nothing half written.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from schemas import InputFileError, NormSpec, load_spec, save_spec
from schemas.atomic_io import atomic_write_bytes, atomic_write_folder

OUTPUT_FORMATS = ("spec", "onnx", "keras", "torch")


def load_layer(path: Path) -> Any:
    """A NormSpec (spec folder) or an onnx.ModelProto (.onnx file)."""
    if not path.exists():
        raise InputFileError(f"'{path}' does not exist; pass a spec folder (spec.json + tensors.safetensors) or an .onnx file.")
    if path.is_dir() or path.name == "spec.json":
        return load_spec(path)
    if path.suffix == ".onnx":
        from converters.onnx_adapter.files import load_onnx

        return load_onnx(path)
    raise InputFileError(
        f"'{path}' is neither a spec folder nor an .onnx file; pickled and other formats are refused because loading them can execute code."
    )


def write_layer(obj: Any, spec: NormSpec, to: str, output: Path) -> Path:
    """Write the converted layer: spec folder, .onnx, .keras (a one-layer model) or torch safetensors state dict."""
    if to == "spec":
        atomic_write_folder(output, lambda folder: save_spec(spec, folder))
    elif to == "onnx":
        atomic_write_bytes(output, obj.SerializeToString())
    elif to == "keras":
        atomic_write_bytes(output, _keras_bytes(obj, spec))
    elif to == "torch":
        atomic_write_folder(output, lambda folder: _torch_folder(obj, spec, folder))
    return output


def keras_input_shape(spec: NormSpec) -> tuple:
    """Input shape (without batch) a Keras layer for `spec` accepts: unknown sizes except the normalised axes."""
    if spec.kind in ("layer", "rms"):
        rank = spec.input_rank or len(spec.normalized_shape) + 2
        return (None,) * (rank - 1 - len(spec.normalized_shape)) + tuple(spec.normalized_shape)
    rank = spec.input_rank or ((spec.spatial_rank or 2) + 2)
    if spec.layout == "channels_first":
        return (spec.num_features,) + (None,) * (rank - 2)
    return (None,) * (rank - 2) + (spec.num_features,)


def _keras_bytes(layer: Any, spec: NormSpec) -> bytes:
    import keras

    from converters.api import read_spec

    keras_spec, _ = read_spec(layer)
    model = keras.Sequential([keras.Input(shape=keras_input_shape(keras_spec), dtype=spec.dtype), layer])
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "layer.keras"
        model.save(path)
        return path.read_bytes()


def _torch_folder(module: Any, spec: NormSpec, folder: Path) -> None:
    """PyTorch output: the state dict as safetensors plus the spec that says how to build the module."""
    from safetensors.torch import save

    state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    # As bytes, not save_file: safetensors creates its files 0600 whatever the umask.
    (folder / "state_dict.safetensors").write_bytes(save(state, metadata={"class": type(module).__name__}))
    save_spec(spec, folder)
