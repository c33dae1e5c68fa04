"""`FrameworkInfo`: every fact about one framework that tables elsewhere need, declared once by its adapter package.

Each adapter package (`converters/<framework>_adapter/info.py`) declares its `INFO` without importing the framework;
the adapter registry (`converters.adapters.REGISTRY.infos()`) collects them, and the tables that used to be written per
framework in several places are built from them: model file suffixes, the structure, upload and pull formats, the
MLflow flavour, the servable origins, the CLI's choices and the HTTP API's literals, the shared worker's packages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FrameworkInfo:
    """The facts of one framework.

    Attributes:
        name: the framework's name in the spec's vocabulary and on the command line (`--to`, `--framework`); also
            the top-level package its own objects come from (how an object's owner is told).
        package: the adapter package holding `FRAMEWORK`, `KIND_ADAPTERS` and `MODEL`.
        default_eps_name: how a hazard names the framework's default eps ("PyTorch's default").
        model_files: model file suffix -> the format as named in messages (".pt2 (torch.export)").
        structure_format: the name of the format the registry stores a model's structure in, and the upload and
            pull format of the same name (`register --server`, `pull --format`); None for a framework whose models
            the registry cannot store.
        structure_suffix: the file suffix of that format.
        archive: (what a file of `structure_format` is, how to save one) when the format is a zip archive, whose
            first bytes are checked before a reader sees it; None otherwise.
        mlflow_flavour: the MLflow flavour a version of this format is pushed as; None when none is.
        object_origin: where a layer of a model object of this framework comes from (a hazard words its fix by it).
        format_origins: artifact format -> the origin of its layers, for formats read some other way (a `.pt2`'s
            layers are exported ops, not live modules).
        layer_suffix: the suffix of one layer written for the framework (`write_layer`); "" for a folder.
        empty_batch: what a training step on an empty batch does to the running statistics, as a phrase.
        worker_packages: the top-level packages a warm worker imports ahead for the framework.
        folder_formats: structure formats given back as a folder of files rather than one file (format -> what such a
            folder is, as named in messages): a Hugging Face checkpoint folder is torch's.
        folder_markers: file names whose presence makes a folder a model of this framework, told before reading it
            (torch: a checkpoint folder's config.json), so the gate's worker for the others can start at once.
    """

    name: str
    package: str
    default_eps_name: str
    model_files: Mapping[str, str]
    structure_format: str | None
    structure_suffix: str | None
    empty_batch: str
    object_origin: str
    layer_suffix: str = ""
    archive: tuple[str, str] | None = None
    mlflow_flavour: str | None = None
    format_origins: Mapping[str, str] = field(default_factory=dict)
    worker_packages: tuple[str, ...] = ()
    folder_formats: Mapping[str, str] = field(default_factory=dict)
    folder_markers: tuple[str, ...] = ()


__all__ = ["FrameworkInfo"]
