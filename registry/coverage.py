"""What a registration must prove before its equivalence checks count: every normalizer is checked, every tensor real.

The gate passing means nothing if a normalizer slipped past it (a reader that could not read a layer, a
manifest that lists state no normalizer uses) or if a tensor header describes bytes that do not exist.
`check_registrable` runs first in the registry's gate, whatever the registration's source.
"""

from __future__ import annotations

from schemas.errors import CheckFailedError, SpecError
from schemas.manifest import STATISTIC_ROLES, ArtifactManifest
from schemas.tensors import check_tensor_record

#: Roles that only normalizer state has (the others are "weight").
STATE_ROLES: frozenset[str] = STATISTIC_ROLES | {"scale", "bias"}


def check_registrable(manifest: ArtifactManifest, specs: list, sites: int | None = None) -> None:
    """Refuse, naming what is wrong, unless each tensor record is valid and each normalization layer gets a check.

    Args:
        manifest: the version's manifest.
        specs: the specs the gate will check, one per manifest normalizer.
        sites: how many normalization layers the model's reader found (None when the manifest is all there is).
    """
    for name, ref in manifest.tensors.items():
        check_tensor_record(name, ref.dtype, ref.shape, ref.nbytes)
    listed = len(manifest.normalizers)
    if len(specs) != listed or (sites is not None and sites != listed):
        found = f"the manifest lists {listed} normalizers"
        if sites is not None:
            found = f"the model holds {sites} normalization layers, the manifest lists {listed}"
        raise CheckFailedError(
            f"{found} and {len(specs)} would be checked, so a layer would pass unchecked; nothing was registered: "
            "report this as a bug in normbridge, with the model."
        )
    used = {tensor for entry in manifest.normalizers for tensor in entry.tensors.values()}
    for name, ref in sorted(manifest.tensors.items()):
        if ref.role in STATE_ROLES and name not in used:
            raise SpecError(
                f"tensor '{name}' holds {ref.role} state but no normalizer of the manifest uses it, so it would pass unchecked; "
                "nothing was registered: export the artifact again with its normalizers listed.",
                layer=ref.layer,
            )


__all__ = ["STATE_ROLES", "check_registrable"]
