"""An ONNX graph's structure: the model with its initializers' raw_data left out, filled back from the tensors by name.

The skeleton is the same ModelProto with every initializer's `raw_data` emptied; putting each tensor's little-endian
bytes back gives `SerializeToString()` of the registered model, so a file written by onnx.save (no external data)
comes back byte-identical. Checked when the structure is cut: if filling the skeleton back does not give the same
bytes (an initializer kept in a typed field such as float_data is left in the skeleton as it is), the whole model is
the part instead, still content-addressed.
"""

from __future__ import annotations


import numpy as np
import onnx
from google.protobuf.message import DecodeError

from schemas import InputFileError

from ..model_structure import StructureParts, little_endian_bytes, sha256_of

PART = "model.onnx"


def _has_data(tensor: onnx.TensorProto) -> bool:
    typed = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
    return bool(tensor.raw_data) or any(len(getattr(tensor, name)) for name in typed) or tensor.data_location == onnx.TensorProto.EXTERNAL


def onnx_structure(model: onnx.ModelProto, tensors: dict[str, np.ndarray]) -> StructureParts:
    """The skeleton of `model` (initializers without raw_data); `tensors` are the initializers by name, as stored."""
    whole = model.SerializeToString()
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    for initializer in skeleton.graph.initializer:
        if initializer.raw_data and initializer.name in tensors:
            initializer.ClearField("raw_data")
    part = skeleton.SerializeToString()
    if _fill(part, tensors, "<registration>") != whole:
        part = whole  # the bytes would not come back the same: keep the graph whole
    return StructureParts("onnx", {PART: part}, sha256_of(whole))


def onnx_file(parts: dict[str, bytes], tensors: dict[str, np.ndarray]) -> bytes:
    """The registered .onnx file's bytes: the skeleton with every initializer's data put back."""
    if set(parts) != {PART}:
        raise InputFileError(f"an ONNX structure holds exactly the part '{PART}', got {sorted(parts)}; the stored version is inconsistent.")
    return _fill(parts[PART], tensors, "the stored structure")


def _fill(part: bytes, tensors: dict[str, np.ndarray], where: str) -> bytes:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(part)
    except (DecodeError, ValueError) as error:
        raise InputFileError(f"{where} '{PART}' is not an ONNX protobuf ({error}); the stored version is corrupted.") from error
    for initializer in model.graph.initializer:
        if not _has_data(initializer):
            array = tensors.get(initializer.name)
            if array is None:
                raise InputFileError(f"initializer '{initializer.name}' of {where} has no tensor in the version; the stored version is inconsistent.")
            initializer.raw_data = little_endian_bytes(array)
    return model.SerializeToString()


__all__ = ["PART", "onnx_file", "onnx_structure"]
