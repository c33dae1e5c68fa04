"""Reading and writing .onnx files without executing anything, and following external data only inside the model's
folder."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from schemas import InputFileError
from schemas.atomic_io import atomic_write_bytes

from .external_data import external_tensors, load_external_data
from .proto import opset_of

#: GroupNormalization-18 is deprecated, so the checker rejects it; normbridge still reads it (per-group affine).
_DEPRECATED_READABLE = ("GroupNormalization", range(18, 21))


def load_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    """Load and check an ONNX model from `path`.

    Raises:
        InputFileError: the file is missing or unreadable, not an ONNX protobuf, keeps
            tensors in external files outside its folder (or missing ones), or fails onnx.checker.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputFileError(
            f"cannot read ONNX file '{path}' ({error.strerror or error}); check the path and its permissions."
        ) from error
    try:
        model = onnx.load_from_string(data)
        del data  # the file's bytes are not held while the checker serializes the model again
    except (DecodeError, ValueError) as error:
        raise InputFileError(
            f"'{path}' is not an ONNX model (protobuf decoding failed: {error}); expected a file written by onnx.save or save_onnx."
        ) from error
    load_external_data(model, path)  # from the model's own folder only (external_data.py)
    _check(model, path)
    return model


def load_onnx_bytes(data: bytes, path: Path) -> onnx.ModelProto:
    """Load and check a self-contained ONNX model from `data` (`path` names it in messages): a tensor kept in an
    external file is refused, since nothing says where that file would be."""
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError) as error:
        raise InputFileError(f"'{path}' is not an ONNX model (protobuf decoding failed: {error}).") from error
    external = [t.name for t in external_tensors(model)]  # initializers, Constants, subgraphs and function bodies alike
    if external:
        raise InputFileError(
            f"'{path}' keeps tensor '{external[0]}' in an external file; a model read from memory must hold all its data."
        )
    _check(model, path)
    return model


def _check(model: onnx.ModelProto, path: Path) -> None:
    """The structural checker only: full_check's strict shape inference also rejects foreign graphs
    normbridge reads fine (a training_mode=1 BatchNormalization exported with Y alone)."""
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        if "deprecated" in str(error) and _uses_deprecated_readable(model):
            return
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputFileError(
            f"'{path}' is not a valid ONNX model ({first_line}); re-export it or run onnx.checker.check_model on it for details."
        ) from error


def _uses_deprecated_readable(model: onnx.ModelProto) -> bool:
    op, versions = _DEPRECATED_READABLE
    return opset_of(model) in versions and any(n.op_type == op for n in model.graph.node)


def save_onnx(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Check `model` and write it to `path` atomically (a temporary file renamed into place)."""
    path = Path(path)
    onnx.checker.check_model(model)
    atomic_write_bytes(path, model.SerializeToString())
    return path
