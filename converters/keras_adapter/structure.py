"""A keras.Model's structure: its config and metadata JSON, rebuilt with safe_mode=True and filled from the tensors by
path.

The config is what `model.save` writes as config.json (`keras.saving.serialize_keras_object`), the metadata the
Keras version (no date, so the same model always gives the same bytes and is stored once). Rebuilding deserialises
the config with safe_mode=True (Lambda layers and other code are refused), assigns every variable the tensor stored
under its path (each variable and each tensor exactly once: a mismatch is refused) and saves a new .keras file.
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from schemas import InputFileError

from ..model_structure import StructureParts
from .artifact_contents import variable_name
from .runtime import import_keras

CONFIG, METADATA = "config.json", "metadata.json"


def keras_structure(model: Any, read_safely: bool = False) -> StructureParts | None:
    """The config and metadata parts; None for a model Keras cannot serialise (a subclassed model without get_config),
    which is then stored as its tensors only (`pull` says so and offers the state dict). `read_safely`: `model` was
    loaded from the registered file with safe_mode=True, and the config is its own serialisation."""
    keras = import_keras()
    try:
        config = keras.saving.serialize_keras_object(model)
        json.dumps(config)
    except (NotImplementedError, TypeError, ValueError):
        return None
    parts = {
        CONFIG: json.dumps(config, sort_keys=True).encode(),
        METADATA: json.dumps({"keras_version": keras.__version__}).encode(),
    }
    return StructureParts("keras", parts, read_safely=read_safely)


def keras_model(parts: dict[str, bytes], tensors: dict[str, np.ndarray]) -> Any:
    """The keras.Model of the structure, its variables set from `tensors` (safe_mode=True: no code runs)."""
    keras = import_keras()
    try:
        config = json.loads(parts[CONFIG])
        model = keras.saving.deserialize_keras_object(config, safe_mode=True)
    except KeyError as error:
        raise InputFileError(
            f"a Keras structure holds '{CONFIG}'; got {sorted(parts)}: the stored version is inconsistent."
        ) from error
    except ValueError as error:
        raise InputFileError(
            f"the stored Keras config cannot be rebuilt with safe_mode=True ({str(error).splitlines()[0][:300]})."
        ) from error
    names = {variable_name(model, v): v for v in model.weights}
    stored = {name for name in tensors if "::" not in name}
    if set(names) != stored:
        missing, extra = sorted(stored - set(names)), sorted(set(names) - stored)
        raise InputFileError(
            f"the rebuilt Keras model's variables do not match the stored tensors (stored only: {missing[:5]}, "
            f"model only: {extra[:5]}); the stored version is inconsistent."
        )
    for name, variable in names.items():
        variable.assign(tensors[name])
    return model


def keras_file(parts: dict[str, bytes], tensors: dict[str, np.ndarray]) -> bytes:
    """A .keras file of the rebuilt model (written by model.save), the same bytes on every pull: `model.save` stamps
    metadata.json with the time and the weights entry with its zip date, so both are set from what was stored."""
    model = keras_model(parts, tensors)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.keras"
        model.save(path)
        return _without_dates(path.read_bytes(), parts.get(METADATA))


def _without_dates(archive: bytes, metadata: bytes | None) -> bytes:
    """The archive's entries in their order, each dated 1980-01-01 (the zip epoch), metadata.json the stored one."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as source, zipfile.ZipFile(out, "w") as target:
        for entry in source.infolist():
            data = metadata if entry.filename == METADATA and metadata is not None else source.read(entry)
            dated = zipfile.ZipInfo(entry.filename, date_time=(1980, 1, 1, 0, 0, 0))
            dated.compress_type, dated.external_attr = entry.compress_type, entry.external_attr
            target.writestr(dated, data)
    return out.getvalue()


__all__ = ["CONFIG", "METADATA", "keras_file", "keras_model", "keras_structure"]
