"""What a whole model holds, as the registry stores it: every tensor, and per normalization layer its spec and holders.

`ModelAdapter.artifact_contents` returns a `ModelContents`: each tensor under the framework's own
name (torch state_dict keys, Keras variable paths, ONNX initializer names) with the layer it
belongs to, and for each normalization layer its spec and, per spec tensor, the model tensor that
should hold the same bytes (`candidates`). The registry turns this into a manifest and blobs
(registry/artifact.py); nothing here knows about either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas import NormSpec

from .model_structure import StructureParts

#: Spec tensor name -> the short names a framework gives the tensor holding it.
NAME_HINTS: dict[str, tuple[str, ...]] = {
    "scale": ("weight", "gamma", "scale"),
    "bias": ("bias", "beta"),
    "running_mean": ("running_mean", "moving_mean"),
    "running_var": ("running_var", "moving_variance"),
    "num_batches_tracked": ("num_batches_tracked",),
}


@dataclass(frozen=True)
class ModelTensor:
    """One tensor of the model, under the framework's name for it; `layer`: the layer path it belongs to, if any.

    `source`, when given, reads the array's bytes again in chunks (converters/tensor_bytes.py): the array may then be
    mapped from the model file, and the registry streams the bytes from there rather than reading the array whole."""

    name: str
    array: np.ndarray
    layer: str | None = None
    source: Any = None


@dataclass(frozen=True)
class ModelNormalizer:
    """One normalization layer: its spec (named by its path) and spec tensor name -> model tensor name to hold it."""

    path: str
    spec: NormSpec
    candidates: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelContents:
    """Everything of a model an artifact stores; `sites` is how many normalization layers the reader found (each must
    become a normalizer, or the registry's gate refuses the model); `mode` None: told by the specs' training flags."""

    framework: str
    format: str
    tensors: list[ModelTensor] = field(default_factory=list)
    normalizers: list[ModelNormalizer] = field(default_factory=list)
    sites: int = 0
    mode: str | None = None
    #: The model adapter's model_hazards: among them the layers that look like normalizations and that no recognizer
    #: proved.
    hazards: list = field(default_factory=list)
    #: The model's structure without the tensor bytes (ModelAdapter.structure_of),
    #: None when only the tensors are stored.
    structure: StructureParts | None = None
    #: True when the model was read from a file for these contents alone: no one else holds its tensors, so they cannot
    #: change and need no snapshot (the registry streams them from where they are); False for a caller's live model.
    private: bool = False


def hinted(prefix: str, names: list[str], separator: str) -> dict[str, str]:
    """Spec tensor name -> the tensor among `names` under `prefix` whose short name is a hint for it."""
    found: dict[str, str] = {}
    for name in names:
        if prefix and not name.startswith(prefix + separator):
            continue
        short = name[len(prefix) + 1 :] if prefix else name
        for spec_name, hints in NAME_HINTS.items():
            if short in hints and spec_name not in found:
                found[spec_name] = name
    return found


def hint_index(names: list[str], separator: str) -> Callable[[str], dict[str, str]]:
    """`hinted(prefix, names, separator)` for any prefix, `names` grouped once by the prefix before their last
    separator.

    Why: a model's every normalizer looked through all its tensor names (160 RMSNorms x 482 tensors). A name `hinted`
    takes for a prefix is that prefix, the separator and a hint, which holds no separator: its group is the prefix."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.rpartition(separator)[0], []).append(name)
    return lambda prefix: hinted(prefix, groups.get(prefix, []), separator)


__all__ = ["NAME_HINTS", "ModelContents", "ModelNormalizer", "ModelTensor", "hint_index", "hinted"]
