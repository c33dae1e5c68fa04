"""A version's running statistics, as the drift history compares serving windows with them (read once per version,
cached), with each layer's batch counter and momentum, which the convergence rule reads (drift_status.py).

Versions are immutable, so the statistics are cached by the version's artifact digest. A layer sent by a collector is
found by the normalizer's path in the manifest, or by the name its running-mean tensor carries without the suffix
('features.1.running_mean' -> 'features.1', 'bn/moving_mean' -> 'bn'): a torch module path, a Keras layer name and
an ONNX BatchNormalization's initializer prefix all land on their layer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from registry.tensor_blobs import tensor_from_blob
from schemas.floats import decimal_complement
from schemas.manifest import load_manifest
from schemas.monitoring import statistics_digest

#: Versions whose statistics one process keeps in memory.
CACHE_SIZE = 64
SUFFIXES = (".running_mean", "/moving_mean", ":moving_mean", ".moving_mean", "_mean")


@dataclass(frozen=True)
class ReferenceLayer:
    path: str
    running_mean: np.ndarray
    running_var: np.ndarray
    eps: float
    batches_tracked: int | None = None  # num_batches_tracked where the version keeps it (torch sources), else None
    momentum: float | None = None  # PyTorch's convention (weight of a new batch), as the convergence rule reads it

    @property
    def channels(self) -> int:
        return int(self.running_mean.shape[0])


@dataclass
class Reference:
    """The BatchNorm running statistics of one version, with every name a collector may call each layer by."""

    ref: str
    digest: str
    layers: list[ReferenceLayer] = field(default_factory=list)
    aliases: dict[str, ReferenceLayer] = field(default_factory=dict)

    def layer(self, name: str) -> ReferenceLayer | None:
        return self.aliases.get(name)

    def names(self) -> list[str]:
        return [layer.path for layer in self.layers]


def _strip(name: str) -> str | None:
    return next((name[: -len(s)] for s in SUFFIXES if name.endswith(s) and len(name) > len(s)), None)


def _read(registry, version) -> Reference:
    manifest = load_manifest(version.manifest)
    layers, aliases = [], {}
    for entry in manifest.normalizers:
        spec = entry.spec
        names = entry.tensors
        if spec.get("kind") != "batch" or "running_mean" not in names or "running_var" not in names:
            continue
        arrays = []
        for role in ("running_mean", "running_var"):
            tensor = manifest.tensors[names[role]]
            arrays.append(
                np.asarray(
                    tensor_from_blob(registry.store.get(tensor.digest), tensor, names[role]), dtype=np.float64
                ).reshape(-1)
            )
        layer = ReferenceLayer(
            entry.path,
            arrays[0],
            arrays[1],
            float(spec["eps"]),
            _tracked(registry, manifest, names),
            _batch_weight(spec),
        )
        layers.append(layer)
        aliases.setdefault(entry.path, layer)
        stripped = _strip(names["running_mean"])
        if stripped:
            aliases.setdefault(stripped, layer)
    digest = statistics_digest((layer.running_mean, layer.running_var) for layer in layers)
    return Reference(ref=f"{version.model}@{version.number}", digest=digest, layers=layers, aliases=aliases)


def _tracked(registry, manifest, names: dict[str, str]) -> int | None:
    if "num_batches_tracked" not in names:
        return None
    tensor = manifest.tensors[names["num_batches_tracked"]]
    return int(
        np.asarray(tensor_from_blob(registry.store.get(tensor.digest), tensor, names["num_batches_tracked"])).reshape(
            -1
        )[0]
    )


def _batch_weight(spec: dict) -> float | None:
    """The momentum as the weight of a new batch (Keras and ONNX store the running weight: complemented on its
    decimal)."""
    momentum = spec.get("momentum")
    if momentum is None:
        return None
    return float(momentum) if spec.get("momentum_convention") == "batch_weight" else decimal_complement(float(momentum))


_cache: OrderedDict[str, Reference] = OrderedDict()
_lock = threading.Lock()


def reference_of(registry, version) -> Reference:
    """The running statistics of `version` (a VersionRecord), read through the blob store once per process."""
    key = f"{registry.blob_uri}|{version.digest}"
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    reference = _read(registry, version)
    with _lock:
        _cache[key] = reference
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return reference


__all__ = ["Reference", "ReferenceLayer", "reference_of"]
