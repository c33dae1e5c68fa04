"""What the registry stores of a checkpoint folder: every tensor as saved, streamed from its byte range, and the specs.

Each tensor is an array mapped from its range of the safetensors file (never read whole: the registry reads only the
normalizations' tensors through it, to point each spec at the tensor holding its bytes) with a `FileRangeBytes`
source, from which the registry hashes and stages its blob a chunk at a time (converters/tensor_bytes.py). The
normalizations are the ones inspection lists, read from the modules `meta_model` materialised. A folder is stored as a
torch module's state is (format `torch-module`), with the folder itself as its structure (folder_structure.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from schemas import InputFileError
from schemas.layer_errors import read_layer
from schemas.safetensors_io import SAFETENSORS_DTYPES

from ...model_contents import ModelContents, ModelNormalizer, ModelTensor, hint_index
from ...model_values import NormLayerRef
from ...models.walking import spec_of
from ...tensor_bytes import FileRangeBytes
from ..artifact_contents import refuse_unread_layers
from .safetensors_index import TensorEntry

#: safetensors dtype code -> the NumPy dtype the registry stores it as (schemas/safetensors_io.py's table, the one the
#: registry's own safetensors files use).
_NUMPY = {
    code: np.dtype(ml_dtypes.bfloat16 if name == "bfloat16" else name) for code, name in SAFETENSORS_DTYPES.items()
}


def _array(entry: TensorEntry) -> np.ndarray:
    dtype = _NUMPY.get(entry.dtype)
    if dtype is None:
        raise InputFileError(
            f"'{entry.file}': tensor '{entry.name}' has dtype {entry.dtype}, which the registry does not store; save "
            f"the checkpoint in one of {', '.join(_NUMPY)}."
        )
    if entry.length == 0:
        return np.zeros(entry.shape, dtype=dtype)
    return np.memmap(entry.file, dtype=dtype, mode="r", offset=entry.start, shape=entry.shape)


def folder_contents(model: torch.nn.Module, named: dict[str, TensorEntry], refs: list[NormLayerRef]) -> ModelContents:
    """The contents of a checkpoint folder's model: `named`, the files' tensors under the model's names."""
    refuse_unread_layers(model, refs)
    specs = [(ref, read_layer(lambda ref=ref: spec_of(ref), ref.path)) for ref in refs]
    tensors = [
        ModelTensor(
            name, _array(entry), name.rpartition(".")[0] or None, FileRangeBytes(entry.file, entry.start, entry.length)
        )
        for name, entry in sorted(named.items())
    ]
    hints = hint_index([t.name for t in tensors], ".")
    normalizers = [ModelNormalizer(ref.path, spec, hints(ref.path)) for ref, spec in specs]
    return ModelContents("torch", "torch-module", tensors, normalizers, sites=len(refs), mode="eval")


__all__ = ["FileRangeBytes", "folder_contents"]
