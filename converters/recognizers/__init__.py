"""The registry of recognizers and their interfaces (`base.py`); each framework's recognizers live beside its adapter.

A framework's stock recognizers are the modules its adapter package lists in `<package>.recognizers.STOCK_RECOGNIZERS`
(`converters/torch_adapter/recognizers/__init__.py`, ...), in the order they are asked; each module defines
`RECOGNIZER`. The adapter package of a framework is the adapter registry's (`converters.adapters.REGISTRY.packages`),
so this package names no framework and imports none: a framework's recognizers are imported the first time one of them
is needed, and recognising a torch module never imports TensorFlow. `register()` adds another one (asked after the
stock ones of its framework). Registering a name twice raises, and asking for a missing one lists what is registered.
`declared.py` holds `converters.recognize`, a user's declaration of a class of their own.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, TypeVar

from schemas import AdapterNotFoundError, DuplicateAdapterError

from ..adapters import REGISTRY
from .base import GraphRecognizer, ObjectRecognizer, Recognizer


def stock_recognizers(package: str) -> tuple[str, ...]:
    """The modules holding the stock recognizers of the adapter package `package`, in the order they are asked: its
    `recognizers` sub-package's `STOCK_RECOGNIZERS`; none when it has no such sub-package (then
    tests/converters/test_coverage.py::test_every_framework_has_a_model_adapter_its_files_and_recognizers fails)."""
    name = f"{package}.recognizers"
    try:
        listing = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:
            raise
        return ()
    return tuple(f"{name}.{module}" for module in listing.STOCK_RECOGNIZERS)


R = TypeVar("R", bound=Recognizer)


class RecognizerRegistry:
    """Recognizers by name, asked per framework in registration order; stock ones load on first use.

    `packages`: framework -> its adapter package, whose stock recognizers are loaded (`stock_recognizers`); by default
    the adapter registry's, asked when a framework's recognizers are first needed.
    """

    def __init__(self, packages: dict[str, str] | None = None):
        self._packages = None if packages is None else dict(packages)
        self._loaded: set[str] = set()
        self._by_name: dict[str, Recognizer] = {}
        self._lock = threading.RLock()

    def _load(self, framework: str) -> None:
        with self._lock:
            if framework in self._loaded:
                return
            self._loaded.add(framework)
            package = self._frameworks().get(framework)
            for module_name in stock_recognizers(package) if package is not None else ():
                recognizer = importlib.import_module(module_name).RECOGNIZER
                if recognizer.framework != framework:
                    raise DuplicateAdapterError(
                        f"{module_name} declares a {recognizer.framework} recognizer but is listed for {framework}."
                    )
                self._add(recognizer)

    def _frameworks(self) -> dict[str, str]:
        return REGISTRY.packages if self._packages is None else self._packages

    def _add(self, recognizer: Recognizer) -> None:
        if recognizer.name in self._by_name:
            existing = type(self._by_name[recognizer.name]).__name__
            raise DuplicateAdapterError(
                f"a recognizer named '{recognizer.name}' is already registered ({existing}); give the new one another name."
            )
        self._by_name[recognizer.name] = recognizer

    def register(self, recognizer: Recognizer) -> None:
        """Add `recognizer`, asked after the stock recognizers of its framework and those registered before it."""
        if not isinstance(recognizer, (ObjectRecognizer, GraphRecognizer)):
            raise TypeError(
                f"got a {type(recognizer).__name__}, expected an ObjectRecognizer or a GraphRecognizer instance."
            )
        with self._lock:
            self._load(recognizer.framework)
            self._add(recognizer)

    def get(self, name: str) -> Recognizer:
        """The recognizer called `name`, or an error listing the registered ones."""
        with self._lock:
            for framework in self._frameworks():
                self._load(framework)
            if name not in self._by_name:
                raise AdapterNotFoundError(
                    f"no recognizer is named '{name}'; currently registered recognizers are {', '.join(self._by_name)}."
                )
            return self._by_name[name]

    def of(self, framework: str, family: type[R]) -> list[R]:
        """The recognizers of `framework` in the family `family`, in the order they are asked."""
        self._load(framework)
        with self._lock:
            return [r for r in self._by_name.values() if r.framework == framework and isinstance(r, family)]

    def kind_of(self, framework: str, obj: Any) -> str | None:
        """The first kind a recognizer of `framework` reads in `obj`, or None."""
        for recognizer in self.of(framework, ObjectRecognizer):
            kind = recognizer.kind_of(obj)
            if kind is not None:
                return kind
        return None


#: The process-wide recognizers the converters ask.
RECOGNIZERS = RecognizerRegistry()


def register(recognizer: Recognizer) -> None:
    """Register a recognizer for a normalization class that is not a stock one (see RecognizerRegistry.register)."""
    RECOGNIZERS.register(recognizer)


def kind_of(framework: str, obj: Any) -> str | None:
    """The kind the recognizers of `framework` read in `obj`, or None."""
    return RECOGNIZERS.kind_of(framework, obj)


__all__ = [
    "GraphRecognizer",
    "ObjectRecognizer",
    "RECOGNIZERS",
    "Recognizer",
    "RecognizerRegistry",
    "kind_of",
    "register",
    "stock_recognizers",
]
