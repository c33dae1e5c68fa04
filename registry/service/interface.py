"""`ModelRegistry`: what a registry offers, whether it is local (`Registry`) or on a server (`RemoteRegistry`).

The CLI's registry commands take either (`--server` picks the remote one), so the two must answer the same calls with
the same records: this interface declares those calls, and `tests/registry/http/test_one_interface.py` runs one
scenario through both and holds their answers equal. A method one side lacks fails at construction (an ABC), not when
a command first calls it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ModelRegistry(abc.ABC):
    """The calls a local and a remote registry both answer, with the same records
    (registry.entities, service.results)."""

    # -- writing -------------------------------------------------------------------------

    @abc.abstractmethod
    def register(
        self,
        name: str,
        model: Any,
        parent: str | None = None,
        note: str | None = None,
        operation: str | None = None,
        progress=None,
        allow_unrecognised: bool = False,
    ):
        """Register `model` (a model file, an artifact folder or, locally, a model object) as the next version of
        `name`, only if the equivalence gate passes; a `Registration`."""

    @abc.abstractmethod
    def set_alias(self, name: str, alias: str, ref: str, force: bool = False):
        """Point `name@alias` at version `ref`; the `AliasRecord`."""

    # -- reading -------------------------------------------------------------------------

    @abc.abstractmethod
    def models(self) -> list[tuple[str, int, int]]:
        """(name, latest version, number of versions) per model."""

    @abc.abstractmethod
    def versions(self, name: str) -> list:
        """Every `VersionRecord` of `name`, oldest first."""

    @abc.abstractmethod
    def show(self, ref: str):
        """The `VersionRecord` of NAME@N, NAME@alias or NAME (latest), with its servable verdict."""

    @abc.abstractmethod
    def manifest(self, ref: str):
        """The validated `ArtifactManifest` of a version."""

    @abc.abstractmethod
    def aliases(self, name: str) -> list:
        """The `AliasRecord`s of `name`."""

    @abc.abstractmethod
    def specs(self, ref: str) -> list:
        """The version's NormSpecs, rebuilt from its manifest and its re-hashed blobs."""

    @abc.abstractmethod
    def tensors(self, ref: str) -> dict:
        """The version's tensors as NumPy arrays (every blob re-hashed)."""

    @abc.abstractmethod
    def blob_reader(self, record) -> Callable[[str], bytes]:
        """A reader of the blobs of version `record` that refuses tampered bytes."""

    @abc.abstractmethod
    def diff(self, ref_a: str, ref_b: str):
        """The `ManifestDiff` from version a to version b."""

    @abc.abstractmethod
    def lineage(self, ref: str):
        """The `LineageView` of a version."""

    @abc.abstractmethod
    def audit(self, model: str | None = None, user: str | None = None) -> list:
        """Audit entries, oldest first, optionally for one model or one user."""

    @abc.abstractmethod
    def verify_audit(self, pinned_head: str | None = None) -> list[str]:
        """Problems of the audit hash chain (empty when intact)."""

    @abc.abstractmethod
    def check_audit(self, pinned_head: str | None = None):
        """The audit chain verified, with the head it ends at."""

    # -- model files and layers ----------------------------------------------------------

    @abc.abstractmethod
    def model_file(self, ref: str, fmt: str | None = None, progress=None):
        """The version as a runnable model file in memory (`ModelFile`)."""

    @abc.abstractmethod
    def pull(self, ref: str, path: str | Path, fmt: str | None = None, progress=None):
        """Write the version as a runnable model file (or its state dict) at `path`; a `PullResult`."""

    @abc.abstractmethod
    def load(self, ref: str) -> Any:
        """The version as a model object of its framework."""

    @abc.abstractmethod
    def export(self, ref: str, to: str, folder: str | Path):
        """Write every normalization layer of a version through the converters into `folder`; a `RegistryExport`."""

    # -- upkeep --------------------------------------------------------------------------

    @abc.abstractmethod
    def verify(self, ref: str | None = None, rerun_checks: bool = True):
        """Re-hash the blobs of one version or all, optionally re-run the equivalence check; a `VerifyResult`."""

    @abc.abstractmethod
    def gc(self, grace_seconds: float = 3600.0):
        """Delete blobs no version references (older than `grace_seconds`); a `GcResult`."""


__all__ = ["ModelRegistry"]
