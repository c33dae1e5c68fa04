"""A version's stored structure is checked once, at registration, so that `pull` need not read every file back.

`pull` rebuilds a model file from the structure's parts and the version's tensors. The parts of a model read from a
file are what the framework's safe reader accepted when it loaded that file (StructureParts.read_safely). Those of a
model given as an object, of an artifact folder and of an uploaded bundle (hostile until checked) are rebuilt here
with zero tensors of the manifest's dtypes and shapes and read back through the framework's safe reader (normbridge's
`.pt2` reader, the ONNX loader and structural checker, Keras safe_mode); a structure no reader accepts is refused and
nothing is registered. The tensors' values never decide whether these readers accept a file, only their dtypes and
shapes, which `pull` checks on every blob's header against the manifest; so a structure that loads with zeros loads
with the version's own tensors. The version records that its structure was checked (`structure_checked`); `pull`
still reads back the file of a version registered before that record existed.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from converters.adapters import REGISTRY
from schemas.errors import InputFileError, NormbridgeError
from schemas.manifest import ArtifactManifest

from ..tensor_blobs import numpy_dtype


class _Zeros(Mapping):
    """Zero tensors of the manifest's dtypes and shapes, made when first read (np.zeros maps untouched pages lazily)."""

    def __init__(self, manifest: ArtifactManifest):
        self.refs = manifest.tensors

    def __getitem__(self, name: str) -> np.ndarray:
        ref = self.refs[name]
        return np.zeros(ref.shape, dtype=numpy_dtype(ref.dtype))

    def __iter__(self):
        return iter(self.refs)

    def __contains__(self, name: object) -> bool:  # Mapping's default would read the tensor
        return name in self.refs

    def __len__(self) -> int:
        return len(self.refs)


def check_structure(manifest: ArtifactManifest, parts: dict[str, bytes]) -> None:
    """Rebuild the model file of `manifest`'s structure (`parts`, its bytes) and read it back through the framework's
    safe reader; InputFileError naming the reader's objection when it does not load.
    Nothing to do without a structure."""
    if manifest.structure is None:
        return
    fmt = manifest.structure.format
    adapter = REGISTRY.model_adapter(manifest.framework)
    try:
        if (
            fmt in REGISTRY.folder_formats()
        ):  # a folder's parts are JSON and raw bytes: checked as they are, nothing built
            adapter.check_model_folder(parts, {name: (ref.dtype, ref.shape) for name, ref in manifest.tensors.items()})
            return
        data = adapter.model_file(parts, _Zeros(manifest))
        adapter.load_bytes(data, f"structure{REGISTRY.structure_suffixes().get(fmt, '')}")
    # hostile parts may fail anywhere in a framework; each is a refusal, never a 500
    except Exception as error:  # noqa: BLE001
        why = str(error) if isinstance(error, NormbridgeError) else f"{type(error).__name__}: {str(error)[:300]}"
        raise InputFileError(
            f"the stored {fmt} structure of this model does not load back through normbridge's safe reader ({why}); "
            "nothing was registered: register the model file itself, or export the artifact again with normbridge."
        ) from error


__all__ = ["check_structure"]
