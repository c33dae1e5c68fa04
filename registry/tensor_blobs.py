"""One tensor per blob: single-tensor safetensors bytes, and the checks that a blob is the tensor its manifest names.

A blob's header is hostile until checked: its dtype must be one normbridge stores, its shape real and its
byte length the dtype's size times the shape's, and all three must be what the manifest says. Uploads check
bulk tensors from the header alone (no copy of their data); `verify` checks every stored blob the same way.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np

from schemas.errors import InputFileError
from schemas.manifest import TensorRef
from schemas.safetensors_io import SAFETENSORS_DTYPES, load_tensors as st_load, save_tensors as st_save
from schemas.tensors import tensor_record_problem


def tensor_blob(array: np.ndarray) -> bytes:
    """Deterministic single-tensor safetensors bytes (key "tensor")."""
    return st_save({"tensor": np.array(array, order="C", copy=True)})


def tensor_from_blob(data: bytes, ref: TensorRef, name: str) -> np.ndarray:
    """The array in a blob, checked against its manifest entry; InputFileError if it is not that tensor."""
    try:
        array = st_load(data)["tensor"]
    except Exception as error:  # safetensors raises several types for bad bytes
        raise InputFileError(
            f"the blob of tensor '{name}' is not valid single-tensor safetensors ({error}); the artifact is corrupted."
        ) from error
    if ref.shape == [] and array.shape == (1,):
        array = array.reshape(())  # safetensors' NumPy writer stores 0-d arrays as shape (1,)
    if str(array.dtype) != ref.dtype or list(array.shape) != ref.shape:
        raise InputFileError(
            f"the blob of tensor '{name}' holds {array.dtype}{list(array.shape)} but the manifest says {ref.dtype}{ref.shape}."
        )
    return array


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a stored dtype name (bfloat16 is ml_dtypes')."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def tensor_view(data: bytes, ref: TensorRef, name: str) -> np.ndarray:
    """The tensor in a blob as a read-only view of its bytes (no decode, no copy), checked against its manifest entry
    from the header (check_tensor_header): what `pull` reads, where every tensor is written out once anyway."""
    check_tensor_header(data, ref, name)
    start = 8 + int.from_bytes(data[:8], "little")
    dtype = numpy_dtype(ref.dtype)
    return np.frombuffer(data, dtype=dtype, count=ref.nbytes // dtype.itemsize, offset=start).reshape(ref.shape)


def check_tensor_header(data: bytes, ref: TensorRef, name: str, total: int | None = None) -> None:
    """The blob is single-tensor safetensors of the manifest's dtype, shape and size, read from its header alone.

    Bulk tensors of an upload are checked this way (no copy of their data); the normalizers' tensors are
    decoded in full anyway when their specs are built. `data` may be only the blob's start when `total`,
    its whole length, is given. InputFileError says what does not match.
    """
    total = len(data) if total is None else total

    def refuse(problem: str) -> InputFileError:
        return InputFileError(f"the blob of tensor '{name}' {problem}; the artifact is corrupted.")

    if total < 8 or len(data) < 8:
        raise refuse(f"is {total} bytes, too short for a safetensors header")
    length = int.from_bytes(data[:8], "little")
    if length > min(len(data), total) - 8:
        raise refuse(f"declares a {length}-byte header in {total} bytes, so it is not valid single-tensor safetensors")
    try:
        header = json.loads(bytes(data[8 : 8 + length]))
        entry = header["tensor"]
        code, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    except (ValueError, KeyError, TypeError) as error:
        raise refuse(f"has no readable single-tensor safetensors header ({error!r})") from error
    if set(header) - {"tensor", "__metadata__"}:
        raise refuse(f"holds tensors {sorted(set(header) - {'__metadata__'})}, not exactly one named 'tensor'")
    if code not in SAFETENSORS_DTYPES or type(start) is not int or type(end) is not int:
        raise refuse(
            f"has dtype code {code!r} and data offsets {[start, end]!r}, expected one of {', '.join(SAFETENSORS_DTYPES)} and two integers"
        )
    dtype = SAFETENSORS_DTYPES[code]
    problem = tensor_record_problem(dtype, shape, end - start)
    if problem is not None:
        raise refuse(f"header {problem}")
    if ref.shape == [] and shape == [1]:
        shape = []  # safetensors' NumPy writer may store 0-d arrays as shape (1,)
    if dtype != ref.dtype or shape != ref.shape:
        raise InputFileError(
            f"the blob of tensor '{name}' holds {dtype}{shape} but the manifest says {ref.dtype}{ref.shape}."
        )
    if start != 0 or end - start != ref.nbytes or 8 + length + end != total:
        raise refuse(
            f"holds data bytes {start}..{end} of {total - 8 - length}, but the manifest says {ref.nbytes} bytes"
        )


def stored_tensor_problem(name: str, record: dict, data: bytes | None = None) -> str | None:
    """Why a stored version's tensor is not what its manifest row says, or None: for `verify`,
    which reads rows as stored.

    The row's dtype, shape and byte length must agree with each other and, when the blob's bytes `data` are given,
    with its safetensors header.
    """
    if not isinstance(record, dict):
        return f"its manifest entry is {type(record).__name__}, not an object"
    problem = tensor_record_problem(record.get("dtype"), record.get("shape"), record.get("nbytes"))
    if problem is not None:
        return f"the manifest row {problem}"
    try:
        ref = TensorRef.model_validate(record)
    except ValueError as error:  # pydantic's ValidationError
        first = error.errors()[0] if hasattr(error, "errors") else {"loc": (), "msg": str(error)}
        return f"the manifest row is not a valid tensor entry ({'.'.join(map(str, first['loc']))}: {first['msg']})"
    if data is not None:
        try:
            check_tensor_header(data, ref, name)
        except InputFileError as error:
            return str(error)
    return None


__all__ = [
    "SAFETENSORS_DTYPES",
    "check_tensor_header",
    "numpy_dtype",
    "stored_tensor_problem",
    "tensor_blob",
    "tensor_from_blob",
    "tensor_view",
]
