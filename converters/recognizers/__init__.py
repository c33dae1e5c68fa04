"""Recognizers: the place where recognising a normalization lives, one file per recognizer.

The stock recognizers are listed in `STOCK_RECOGNIZERS`, per framework, in the order they are
asked; each module defines `RECOGNIZER`. `register()` adds another one (asked after the stock
ones of its framework). Registering a name twice raises, and asking for a missing one lists what
is registered. A framework's recognizers are imported the first time one of them is needed, so
recognising a torch module never imports TensorFlow.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, TypeVar

from schemas import AdapterNotFoundError, DuplicateAdapterError

from .base import GraphRecognizer, ObjectRecognizer, Recognizer

#: framework -> modules holding its stock recognizers (each a RECOGNIZER), in the order they are asked.
STOCK_RECOGNIZERS: dict[str, tuple[str, ...]] = {
    # torch_computed first: a stock subclass with its own forward computes what its forward says.
    "torch": ("converters.recognizers.torch_computed", "converters.recognizers.torch_modules", "converters.recognizers.torch_aten_ops"),
    "keras": ("converters.recognizers.keras_layers", "converters.recognizers.keras_standardization", "converters.recognizers.keras_probed"),
    "onnx": (
        "converters.recognizers.onnx_ops",
        # Graph recognizers: the more specific spellings first, so they claim their nodes before
        # a native node inside them (torch.onnx's grouped InstanceNormalization) is read alone.
        "converters.recognizers.onnx_grouped_instance_norm",
        "converters.recognizers.onnx_moments",
        "converters.recognizers.onnx_native_nodes",
        "converters.recognizers.onnx_folded_batchnorm",
    ),
}

R = TypeVar("R", bound=Recognizer)


class RecognizerRegistry:
    """Recognizers by name, asked per framework in registration order; stock ones load on first use."""

    def __init__(self, stock: dict[str, tuple[str, ...]] | None = None):
        self._stock = dict(STOCK_RECOGNIZERS if stock is None else stock)
        self._loaded: set[str] = set()
        self._by_name: dict[str, Recognizer] = {}
        self._lock = threading.RLock()

    def _load(self, framework: str) -> None:
        with self._lock:
            if framework in self._loaded:
                return
            self._loaded.add(framework)
            for module_name in self._stock.get(framework, ()):
                recognizer = importlib.import_module(module_name).RECOGNIZER
                if recognizer.framework != framework:
                    raise DuplicateAdapterError(f"{module_name} declares a {recognizer.framework} recognizer but is listed for {framework}.")
                self._add(recognizer)

    def _add(self, recognizer: Recognizer) -> None:
        if recognizer.name in self._by_name:
            existing = type(self._by_name[recognizer.name]).__name__
            raise DuplicateAdapterError(f"a recognizer named '{recognizer.name}' is already registered ({existing}); give the new one another name.")
        self._by_name[recognizer.name] = recognizer

    def register(self, recognizer: Recognizer) -> None:
        """Add `recognizer`, asked after the stock recognizers of its framework and those registered before it."""
        if not isinstance(recognizer, (ObjectRecognizer, GraphRecognizer)):
            raise TypeError(f"got a {type(recognizer).__name__}, expected an ObjectRecognizer or a GraphRecognizer instance.")
        with self._lock:
            self._load(recognizer.framework)
            self._add(recognizer)

    def get(self, name: str) -> Recognizer:
        """The recognizer called `name`, or an error listing the registered ones."""
        with self._lock:
            for framework in self._stock:
                self._load(framework)
            if name not in self._by_name:
                raise AdapterNotFoundError(f"no recognizer is named '{name}'; currently registered recognizers are {', '.join(self._by_name)}.")
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


__all__ = ["GraphRecognizer", "ObjectRecognizer", "RECOGNIZERS", "Recognizer", "RecognizerRegistry", "STOCK_RECOGNIZERS", "kind_of", "register"]
