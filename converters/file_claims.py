"""What a model file's tensors claim to unpack into, read from its metadata before any framework reads it.

A server holds this against its upload limit before handing the file to a reader: a `.pt2` payload config may claim
more elements than its payload stores (a stride-0 view), and a `.keras` file's HDF5 datasets may declare far more than
they store (compressed or never written). Each format's own module does the counting; it is imported here only for a
file of that format, so a server that never receives a `.pt2` never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class Claim(NamedTuple):
    """The bytes a file's tensors claim, and what claims them (a phrase for a message)."""

    nbytes: int
    claimant: str

    def __str__(self) -> str:
        return self.claimant.format(self.nbytes)


def claimed_tensor_bytes(path: Path) -> Claim | None:
    """What the tensors of a `.pt2` or `.keras` file claim; None for another format. A file the counting cannot read
    claims 0: its reader refuses it, naming why."""
    if path.suffix == ".pt2":
        from .torch_adapter.pt2.archive import claimed_tensor_bytes as pt2_claims

        return Claim(pt2_claims(path), "tensors claim {} bytes (elements x itemsize, from its payload configs)")
    if path.suffix == ".keras":
        from .keras_adapter.keras_file_checks import declared_weight_bytes
        from .keras_adapter.weights_file import WEIGHTS

        return Claim(declared_weight_bytes(path), f"'{WEIGHTS}' declares {{}} bytes of weights")
    return None


__all__ = ["Claim", "claimed_tensor_bytes"]
