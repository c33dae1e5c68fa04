"""The command line's framework choices, built from each framework's `FrameworkInfo` (converters.adapters.REGISTRY).

Typer needs an Enum when a command is defined, so these are built at import: a registered framework is a choice of
`convert --to`, `export --to`, `export-layers --to` and, through its structure format, `pull --format`, with no edit
here. Reading the infos imports no framework.
"""

from __future__ import annotations

from enum import Enum

from converters.adapters import REGISTRY


def choices(name: str, values) -> type[Enum]:
    """A str Enum `name` whose members are `values`, each named and valued as itself (as `class X(str, Enum)` is)."""
    return Enum(name, {value: value for value in values}, type=str, module=__name__)


#: A layer written as one framework's object (or a spec folder): `convert --to`.
Target = choices("Target", ("spec", *REGISTRY.framework_names))
#: A framework a command exports to: `export --to` (onnx serves; the others point to export-layers),
#: `export-layers --to`.
FrameworkTarget = choices("FrameworkTarget", REGISTRY.framework_names)
#: What `pull` writes: the version's source format, a structure format, or its state dict.
PullFormat = choices(
    "PullFormat", ("source", *REGISTRY.structure_suffixes(), *REGISTRY.folder_formats(), "safetensors")
)
