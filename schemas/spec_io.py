"""Saving and loading a spec: JSON for the configuration, safetensors for the tensors.

Loading never executes anything: JSON is parsed, safetensors is a flat byte format.
Old schema versions are upgraded here, on read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError

from .errors import InputFileError, SpecError
from .norm_spec import SCHEMA_VERSION, NormSpec
from .safetensors_io import load_tensors as st_load, save_tensors as st_save

SPEC_FILE = "spec.json"
TENSORS_FILE = "tensors.safetensors"


def upgrade_document(document: dict) -> dict:
    """Bring a spec JSON document of any known schema version to the current one."""
    version = document.get("schema_version", 1)
    if not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        raise SpecError(
            f"unknown spec schema_version {version!r}; this normbridge reads versions 1 to {SCHEMA_VERSION}."
        )
    # Version 1 is current: nothing to upgrade yet. Each future version adds one step here.
    return dict(document)


def spec_to_json(spec: NormSpec) -> str:
    """Canonical JSON of the configuration (tensors described by dtype and shape)."""
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, indent=2)


def tensors_to_bytes(spec: NormSpec) -> bytes:
    """The state tensors as one safetensors blob."""
    return st_save({name: np.ascontiguousarray(a) for name, a in spec.tensors.items()})


def spec_from_parts(document: dict, tensor_bytes: bytes | None) -> NormSpec:
    """Rebuild a spec from its JSON document and safetensors bytes, checking they agree."""
    document = upgrade_document(document)
    described = document.pop("tensors", {}) or {}
    tensors: dict[str, np.ndarray] = {}
    if tensor_bytes:
        try:
            tensors = st_load(tensor_bytes)
        except (SafetensorError, ValueError, Exception) as error:  # safetensors raises several types
            raise InputFileError(f"the tensors file is not valid safetensors ({error}); re-export the spec.") from error
    if set(described) != set(tensors):
        raise InputFileError(
            f"the spec JSON describes tensors {sorted(described)} but the safetensors file holds {sorted(tensors)}."
        )
    for name, info in described.items():
        array = tensors[name]
        if list(info.get("shape", [])) == [] and array.shape == (1,):
            # safetensors' NumPy writer stores 0-d arrays as shape (1,); the JSON keeps the truth.
            array = tensors[name] = array.reshape(())
        if str(array.dtype) != info.get("dtype") or list(array.shape) != list(info.get("shape", [])):
            raise InputFileError(
                f"tensor '{name}' is {array.dtype}{list(array.shape)} in safetensors but the JSON says {info.get('dtype')}{info.get('shape')}."
            )
    try:
        return NormSpec(**document, tensors=tensors)
    except SpecError:
        raise
    except Exception as error:  # pydantic ValidationError: report it as a spec error
        raise SpecError(f"the spec JSON does not match the schema: {error}") from error


def save_spec(spec: NormSpec, folder: str | Path) -> Path:
    """Write `spec.json` and `tensors.safetensors` into `folder` (created if needed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TENSORS_FILE).write_bytes(tensors_to_bytes(spec))
    (folder / SPEC_FILE).write_text(spec_to_json(spec) + "\n")
    return folder


def load_spec(folder: str | Path) -> NormSpec:
    """Read a spec saved by `save_spec` (a folder, or the path of its spec.json)."""
    path = Path(folder)
    if path.is_file() and path.suffix == ".json":
        path = path.parent
    spec_path = path / SPEC_FILE
    if not spec_path.is_file():
        raise InputFileError(
            f"no {SPEC_FILE} in '{path}'; expected a folder written by normbridge (spec.json + tensors.safetensors)."
        )
    try:
        document = json.loads(spec_path.read_text())
    except json.JSONDecodeError as error:
        raise InputFileError(f"'{spec_path}' is not valid JSON ({error}).") from error
    if not isinstance(document, dict):
        raise InputFileError(f"'{spec_path}' must hold a JSON object.")
    tensor_path = path / TENSORS_FILE
    return spec_from_parts(document, tensor_path.read_bytes() if tensor_path.is_file() else None)
