"""State tensors inside a spec: NumPy arrays, frozen, described in JSON by dtype and shape."""

from __future__ import annotations

import math
from typing import Annotated, Any, Mapping

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, so np.dtype("bfloat16") and astype("bfloat16") work)
import numpy as np
from pydantic import PlainSerializer, PlainValidator, WithJsonSchema

from .errors import InputFileError, SpecError
from .vocabulary import TENSOR_NAMES

#: Bytes per element of every dtype an artifact tensor may have: those safetensors and NumPy
#: (with ml_dtypes' bfloat16) hold exactly.
STORED_DTYPES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
}


def tensor_record_problem(dtype: Any, shape: Any, nbytes: Any) -> str | None:
    """Why a tensor record (dtype, shape, byte length: a manifest entry or a safetensors header) cannot describe real
    bytes, or None.

    Every record normbridge reads is hostile until checked: a dtype outside STORED_DTYPES, a dimension that is
    not a non-negative integer, or a byte length other than itemsize * prod(shape) would make readers allocate,
    reshape or export the wrong thing.
    """
    if not isinstance(dtype, str) or dtype not in STORED_DTYPES:
        return f"has dtype {dtype!r}, expected one of {', '.join(STORED_DTYPES)}"
    if not isinstance(shape, (list, tuple)) or not all(type(d) is int and d >= 0 for d in shape):
        return f"has shape {shape!r}, expected a list of non-negative integers"
    expected = STORED_DTYPES[dtype] * math.prod(shape)
    if type(nbytes) is not int or nbytes != expected:
        return f"claims {nbytes!r} bytes for {dtype}{list(shape)}, which holds {expected}"
    return None


def check_tensor_record(name: str, dtype: Any, shape: Any, nbytes: Any) -> None:
    """InputFileError naming the tensor when tensor_record_problem finds one."""
    problem = tensor_record_problem(dtype, shape, nbytes)
    if problem is not None:
        raise InputFileError(f"tensor '{name}' {problem}; the artifact is corrupted or was edited: export it again.")


def frozen_array(value: Any, name: str) -> np.ndarray:
    """A read-only, C-contiguous copy of `value`, so a spec can never be mutated through it."""
    if not isinstance(value, np.ndarray):
        raise SpecError(
            f"tensor '{name}' must be a numpy.ndarray (got {type(value).__name__}); convert it with numpy.asarray()."
        )
    array = np.array(value, copy=True, order="C")
    array.setflags(write=False)
    return array


def _validate_tensors(value: Any) -> dict[str, np.ndarray]:
    if not isinstance(value, Mapping):
        raise SpecError(f"tensors must be a mapping of name to numpy array (got {type(value).__name__}).")
    out: dict[str, np.ndarray] = {}
    for name, array in value.items():
        if name not in TENSOR_NAMES:
            raise SpecError(f"unknown tensor '{name}'; expected one of {', '.join(TENSOR_NAMES)}.")
        out[name] = frozen_array(array, name)
    return out


def describe_tensors(tensors: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """JSON description of the tensors: dtype and shape (the bytes live in safetensors)."""
    return {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in sorted(tensors.items())}


TENSOR_DESCRIPTION_SCHEMA = {
    "type": "object",
    "description": "State tensors by name; the JSON holds dtype and shape, the bytes are stored in safetensors.",
    "propertyNames": {"enum": list(TENSOR_NAMES)},
    "additionalProperties": {
        "type": "object",
        "properties": {
            "dtype": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        },
        "required": ["dtype", "shape"],
    },
}

#: The pydantic field type of `NormSpec.tensors`.
TensorMap = Annotated[
    dict[str, np.ndarray],
    PlainValidator(_validate_tensors),
    PlainSerializer(describe_tensors, return_type=dict),
    WithJsonSchema(TENSOR_DESCRIPTION_SCHEMA),
]


def tensors_identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical: same dtype, same shape, same bytes (NaN payloads included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
