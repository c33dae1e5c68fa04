"""The adapter registry: each framework's FrameworkAdapter, ModelAdapter and KindAdapters, keyed by (framework, kind).

Framework packages are listed here explicitly and imported on first use, so that
converting a PyTorch layer to ONNX never pays for importing TensorFlow. Each package
declares `INFO` (its `FrameworkInfo`, read without importing the framework: every per-framework table is built from
these, `infos()`), `FRAMEWORK` (a FrameworkAdapter), `KIND_ADAPTERS` (kind -> KindAdapter class, one
module per kind, `adapter.kind_adapters`) and `MODEL` (a ModelAdapter, read only when a
whole-model tool asks for it); registering a pair twice raises, and asking for a missing one
lists what is available. `register_framework(info)` adds a framework at run time (and `remove_framework` takes it
out again), so a new framework is a new package, not an edit here.
"""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from schemas import (
    AdapterNotFoundError,
    DuplicateAdapterError,
    InputFileError,
    NotExpressibleError,
    UnsupportedObjectError,
)
from schemas import vocabulary
from schemas.kinds import KIND_INFO, register_kind, remove_kind

from . import reference
from .adapter import FrameworkAdapter, KindAdapter, owning_framework
from .framework_info import FrameworkInfo
from .model_adapter import ModelAdapter

#: framework name -> package holding INFO, FRAMEWORK, KIND_ADAPTERS and MODEL: the stock frameworks, in the order
#: `check` runs them. The name is also the top-level package the framework's own objects come from (that is how an
#: object's owner is told).
FRAMEWORK_PACKAGES: dict[str, str] = {
    "torch": "converters.torch_adapter",
    "keras": "converters.keras_adapter",
    "onnx": "converters.onnx_adapter",
}


def __getattr__(name: str):
    # MODEL_FILES is built from the registered frameworks' INFO when first asked (each package is then imported).
    if name == "MODEL_FILES":
        return REGISTRY.model_files()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def imported(framework: str) -> bool:
    """Whether this process has imported `framework` (its name is its top-level package: FRAMEWORK_PACKAGES)."""
    return framework in sys.modules


class AdapterRegistry:
    """Holds framework, model and (framework, kind) adapters; loads packages lazily."""

    def __init__(self, packages: dict[str, str] | None = None):
        self._packages = dict(FRAMEWORK_PACKAGES if packages is None else packages)
        self._frameworks: dict[str, FrameworkAdapter] = {}
        self._models: dict[str, ModelAdapter] = {}
        self._kinds: dict[tuple[str, str], KindAdapter] = {}
        self._lock = threading.RLock()
        self._loaded: set[str] = set()  # frameworks _load has loaded whole (its framework and kind adapters added)

    # -- registration ------------------------------------------------------------------

    def register_framework(self, info: FrameworkInfo) -> None:
        """Add the framework `info` declares (its package holds INFO, FRAMEWORK, KIND_ADAPTERS and MODEL); it is
        asked after the ones registered before it. A name registered already raises."""
        with self._lock:
            if info.name in self._packages:
                raise DuplicateAdapterError(
                    f"framework '{info.name}' is already registered ({self._packages[info.name]})."
                )
            self._packages[info.name] = info.package
            vocabulary.add_framework(info.name)  # specs read from it name it as their source

    def remove_framework(self, name: str) -> None:
        """Take framework `name` and every adapter of it out of the registry (a test restores the registry with it)."""
        with self._lock:
            self._packages.pop(name, None)
            vocabulary.remove_framework(name)
            self._frameworks.pop(name, None)
            self._models.pop(name, None)
            self._loaded.discard(name)
            for key in [key for key in self._kinds if key[0] == name]:
                del self._kinds[key]

    def add_kind(self, rules: ModuleType, oracle: ModuleType) -> None:
        """Add a kind at run time: `rules` is its spec module (INFO, a KindInfo, and validate, as
        schemas/kinds/<kind>.py), `oracle` its NumPy reference (forward, and batch_moments with running statistics, as
        converters/reference/<kind>.py). Each framework registered afterwards finds its `<package>.<kind>` adapter
        module; one without it refuses the kind (NotExpressibleError). A kind known already raises."""
        with self._lock:
            register_kind(rules)
            reference.register_kind(rules.INFO.kind, oracle)

    def remove_kind(self, kind: str) -> None:
        """Take a kind added by `add_kind` out again, with every adapter of it
        (a test restores the registry with it)."""
        with self._lock:
            for key in [key for key in self._kinds if key[1] == kind]:
                del self._kinds[key]
            reference.remove_kind(kind)
            remove_kind(kind)

    def add_framework(self, adapter: FrameworkAdapter) -> None:
        with self._lock:
            if adapter.name in self._frameworks:
                raise DuplicateAdapterError(f"framework '{adapter.name}' is already registered.")
            self._frameworks[adapter.name] = adapter

    def add(self, adapter: KindAdapter) -> None:
        """Register one (framework, kind) adapter; a second one for the same pair raises."""
        key = (adapter.framework, adapter.kind)
        with self._lock:
            if key in self._kinds:
                existing = type(self._kinds[key]).__name__
                raise DuplicateAdapterError(
                    f"an adapter for {key} is already registered ({existing}); remove one of them."
                )
            self._kinds[key] = adapter

    def _package(self, framework: str):
        if framework not in self._packages:
            raise AdapterNotFoundError(
                f"unknown framework '{framework}'; currently registered frameworks are {', '.join(sorted(self._packages))}."
            )
        return importlib.import_module(self._packages[framework])

    def _load(self, framework: str) -> None:
        if framework in self._loaded:  # every lookup asks: the lock is for the first, which loads its adapters
            return
        with self._lock:
            if framework in self._frameworks:
                return
            module = self._package(framework)
            self.add_framework(module.FRAMEWORK)
            for kind, adapter_class in module.KIND_ADAPTERS.items():
                adapter = adapter_class()
                if adapter.kind != kind or adapter.framework != framework:
                    raise DuplicateAdapterError(
                        f"{adapter_class.__name__} declares ({adapter.framework}, {adapter.kind}) but is listed as ({framework}, {kind})."
                    )
                self.add(adapter)
            self._loaded.add(framework)

    # -- lookup ------------------------------------------------------------------------

    @property
    def packages(self) -> dict[str, str]:
        """framework name -> the package holding its adapters (a worker process builds the same registry from it)."""
        return dict(self._packages)

    @property
    def framework_names(self) -> list[str]:
        """The registered frameworks, in registration order (the order `check` runs them)."""
        return list(self._packages)

    def info(self, name: str) -> FrameworkInfo:
        """The facts framework `name`'s package declares (its INFO; the framework itself is not imported)."""
        info = getattr(self._package(name), "INFO", None)
        if not isinstance(info, FrameworkInfo) or info.name != name:
            raise AdapterNotFoundError(
                f"framework '{name}' declares no FrameworkInfo ({self._packages[name]}.INFO is a "
                f"{type(info).__name__}, expected one named '{name}')."
            )
        return info

    def infos(self) -> list[FrameworkInfo]:
        """Every registered framework's facts, in registration order: what per-framework tables are built from."""
        return [self.info(name) for name in list(self._packages)]

    def model_files(self) -> dict[str, tuple[str, str]]:
        """Model file suffix -> (framework whose ModelAdapter loads it, the format as named in messages)."""
        return {
            suffix: (info.name, described) for info in self.infos() for suffix, described in info.model_files.items()
        }

    def structure_suffixes(self) -> dict[str, str]:
        """Structure format -> its file suffix (what `pull` writes and an upload is saved as), for every framework whose
        models the registry stores."""
        return {
            info.structure_format: info.structure_suffix for info in self.infos() if info.structure_format is not None
        }

    def folder_framework(self, folder: Path) -> str | None:
        """The framework whose model folder `folder` is, told from its marker files alone
        (FrameworkInfo.folder_markers); None for a spec or artifact folder, or one no framework marks."""
        if (folder / "spec.json").exists() or (folder / "manifest.json").exists():
            return None
        return next(
            (info.name for info in self.infos() for marker in info.folder_markers if (folder / marker).is_file()), None
        )

    def folder_formats(self) -> dict[str, str]:
        """Structure format -> the framework whose model adapter writes it back as a folder
        (FrameworkInfo.folder_formats)."""
        return {fmt: info.name for info in self.infos() for fmt in info.folder_formats}

    def framework(self, name: str) -> FrameworkAdapter:
        self._load(name)
        return self._frameworks[name]

    def import_frameworks(self, names) -> None:
        """Import each framework of `names` now (its adapter package and the framework itself), as a first use would."""
        for name in names:
            self.framework(name).version()

    def get(self, framework: str, kind: str, layer: str = "?") -> KindAdapter:
        """The adapter for (framework, kind); NotExpressibleError naming the kind (for `layer`) when the framework has
        none for a known kind, or an error listing the registered pairs."""
        self._load(framework)
        try:
            return self._kinds[(framework, kind)]
        except KeyError:
            if (
                kind in KIND_INFO and framework in self._packages
            ):  # a kind the framework has no adapter for: it cannot hold it
                raise NotExpressibleError(
                    f"{framework} has no {kind} layer: no adapter of {self._packages[framework]} converts kind '{kind}' "
                    f"({KIND_INFO[kind].summary}).",
                    layer=layer,
                    setting="kind",
                    target=framework,
                ) from None
            available = ", ".join(f"{f}/{k}" for f, k in sorted(self._kinds))
            raise AdapterNotFoundError(
                f"no adapter converts kind '{kind}' for framework '{framework}'; currently registered pairs are {available}."
            ) from None

    def framework_of(self, obj: Any) -> FrameworkAdapter:
        """The framework adapter that owns the layer `obj` (told without importing other frameworks)."""
        name = owning_framework(obj, self._packages)
        if name is not None:
            adapter = self.framework(name)
            if adapter.owns(obj):
                return adapter
        raise UnsupportedObjectError(
            f"got a {type(obj).__module__}.{type(obj).__qualname__}, expected a torch.nn.Module, a Keras layer or an onnx.ModelProto holding one normalization layer."
        )

    def model_adapter(self, name: str) -> ModelAdapter:
        """The whole-model adapter of framework `name` (its package's MODEL)."""
        with self._lock:
            if name not in self._models:
                module = self._package(name)
                adapter = getattr(module, "MODEL", None)
                if not isinstance(adapter, ModelAdapter) or adapter.framework != name:
                    raise AdapterNotFoundError(
                        f"framework '{name}' has no model adapter ({self._packages[name]}.MODEL is a {type(adapter).__name__}, expected a "
                        f"ModelAdapter for '{name}'); whole models of it cannot be read."
                    )
                self._models[name] = adapter
            return self._models[name]

    def model_framework(self, model: Any) -> str:
        """The framework that owns the whole model `model` (an ExportedProgram is torch's)."""
        name = owning_framework(model, self._packages)
        if name is None:
            raise InputFileError(
                f"got a {type(model).__module__}.{type(model).__qualname__}, expected a PyTorch, Keras or ONNX model."
            )
        return name

    def model_adapter_of(self, model: Any) -> ModelAdapter:
        """The model adapter of the framework that owns `model`."""
        return self.model_adapter(self.model_framework(model))

    def pairs(self) -> list[tuple[str, str]]:
        """Every registered (framework, kind) pair, loading all frameworks."""
        for name in self._packages:
            self._load(name)
        return sorted(self._kinds)


#: The process-wide registry the public API uses.
REGISTRY = AdapterRegistry()
