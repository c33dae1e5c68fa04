"""safetensors bytes <-> NumPy arrays, bfloat16 included.

`safetensors.numpy.load` cannot build a BF16 array (NumPy has no bfloat16 of its own), so every reader in
normbridge goes through `load_tensors`: safetensors parses and checks the file, and each tensor's bytes are
viewed as the NumPy dtype of its code, BF16 as `ml_dtypes.bfloat16`. Writing goes through `save_tensors`:
`safetensors.numpy.save` (which already names an ml_dtypes bfloat16 array BF16), with its metadata's keys put in sorted
order, because safetensors writes the metadata from a hash map in a different order every run and the same
tensors must always give the same bytes (a pulled file's sha256, a content-addressed blob).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
from safetensors import deserialize
from safetensors.numpy import save as _save

#: safetensors dtype code -> NumPy dtype name (schemas.tensors.STORED_DTYPES holds the same names).
SAFETENSORS_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
}
_NUMPY = {
    code: (ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)) for code, name in SAFETENSORS_DTYPES.items()
}


def load_tensors(data: bytes) -> dict[str, np.ndarray]:
    """Every tensor of safetensors `data`, writable copies; ValueError naming a dtype code normbridge does not store."""
    out = {}
    for name, entry in deserialize(bytes(data)):
        code = entry["dtype"]
        if code not in _NUMPY:
            raise ValueError(
                f"tensor '{name}' has dtype code {code!r}, expected one of {', '.join(SAFETENSORS_DTYPES)}"
            )
        out[name] = np.frombuffer(bytes(entry["data"]), dtype=_NUMPY[code]).reshape(entry["shape"]).copy()
    return out


def save_tensors(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors bytes of `tensors` (and string `metadata`), the same bytes for the same content every time. Only
    the metadata is reordered: the tensors' entries stay as safetensors writes them
    (a blob's digest depends on them)."""
    data = _save(tensors, metadata=metadata)
    if not metadata or len(metadata) < 2:
        return data
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads its header with spaces to a multiple of 8 bytes
    return len(text).to_bytes(8, "little") + text + data[8 + size :]
