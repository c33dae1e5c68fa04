"""Writing each normalization layer of a version through the converters: one file per layer, with its report.

Shared by `Registry.export` and the HTTP client (`RemoteRegistry.export`), which rebuilds the specs
from a downloaded bundle; the per-layer files are converters.write_layer's.
"""

from __future__ import annotations

import re
from pathlib import Path

from converters import REGISTRY, ConversionOptions, write_layer
from converters.api import write_spec
from schemas import ConversionReport
from schemas.atomic_io import make_folder
from schemas.errors import RegistryError

from .results import ExportedLayer, RegistryExport


def export_layers(manifest, specs: list, to: str, folder: str | Path, version: str) -> RegistryExport:
    """Write each normalizer of an artifact (manifest + its rebuilt specs) through the converters into `folder`.

    Shared by `Registry.export` and the HTTP client, which rebuilds the specs from a downloaded bundle.
    """
    names = REGISTRY.framework_names
    if to not in names:
        raise RegistryError(
            f"export to '{to}' is not supported; use {', '.join(repr(n) for n in names[:-1])} or {names[-1]!r}."
        )
    folder = make_folder(folder)
    layers = []
    for entry, spec in zip(manifest.normalizers, specs):
        obj, layer_report = write_spec(spec, to, ConversionOptions())
        report = ConversionReport(layers=[layer_report])
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", entry.path) or "layer"
        suffix = REGISTRY.info(to).layer_suffix  # "" (torch): a folder, the state dict beside its spec
        target = write_layer(obj, spec, to, folder / f"{stem}{suffix}")
        layers.append(ExportedLayer(path=entry.path, file=str(target), report=report.render_text()))
    return RegistryExport(version=version, to=to, folder=str(folder), layers=layers)


__all__ = ["export_layers"]
