"""A version's state dict as one safetensors file, the Hugging Face convention: tensors by name,
normalizer specs in the metadata.

Keys are the model's own tensor names (torch state_dict keys, Keras variable paths, ONNX initializer names), so the
file of a torch version loads with `load_state_dict(safetensors.torch.load_file(f), strict=True)`. Left out: the
spec tensors a framework does not hold ('<path>::<name>', normbridge's additions) and a .pt2 program's lifted
constants, which are not in the module's state dict. The metadata (strings only, as safetensors requires) carries
`format` ("pt" for torch, as transformers writes it, else the framework), the manifest's content digest and every
normalizer's path and spec configuration as JSON.
"""

from __future__ import annotations

import json

import numpy as np

from schemas.manifest import ArtifactManifest
from schemas.safetensors_io import save_tensors

#: The .pt2 config that names a program's lifted constants (not part of a module's state dict).
PT2_CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
EXTRA_SEPARATOR = "::"


def state_dict_names(manifest: ArtifactManifest, parts: dict[str, bytes]) -> list[str]:
    """The tensor names of the version's state dict, sorted."""
    constants: set[str] = set()
    if PT2_CONSTANTS_CONFIG in parts:
        try:
            constants = set(json.loads(parts[PT2_CONSTANTS_CONFIG]).get("config", {}))
        except (ValueError, AttributeError):
            constants = set()
    return sorted(name for name in manifest.tensors if EXTRA_SEPARATOR not in name and name not in constants)


def state_dict_metadata(manifest: ArtifactManifest) -> dict[str, str]:
    normalizers = [{"path": entry.path, "spec": entry.spec} for entry in manifest.normalizers]
    return {
        "format": "pt" if manifest.framework == "torch" else manifest.framework,
        "normbridge.content_digest": manifest.content_digest(),
        "normbridge.normalizers": json.dumps(normalizers, sort_keys=True, separators=(",", ":")),
    }


def state_dict_file(manifest: ArtifactManifest, tensors: dict[str, np.ndarray], parts: dict[str, bytes]) -> bytes:
    """The safetensors bytes of the version's state dict."""
    names = state_dict_names(manifest, parts)
    arrays = {
        name: np.require(tensors[name], requirements="C") for name in names
    }  # ascontiguousarray makes a 0-d tensor 1-d
    return save_tensors(arrays, metadata=state_dict_metadata(manifest))


__all__ = ["state_dict_file", "state_dict_metadata", "state_dict_names"]
