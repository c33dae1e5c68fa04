"""State tensors inside a spec: NumPy arrays, frozen, described in JSON by dtype and shape."""

from __future__ import annotations

from typing import Annotated, Any, Mapping

import numpy as np
from pydantic import PlainSerializer, PlainValidator, WithJsonSchema

from .errors import SpecError
from .vocabulary import TENSOR_NAMES


def frozen_array(value: Any, name: str) -> np.ndarray:
    """A read-only, C-contiguous copy of `value`, so a spec can never be mutated through it."""
    if not isinstance(value, np.ndarray):
        raise SpecError(f"tensor '{name}' must be a numpy.ndarray (got {type(value).__name__}); convert it with numpy.asarray().")
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
