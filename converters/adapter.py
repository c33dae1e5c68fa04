"""The two abstract interfaces every framework package implements for single layers, and who owns an object.

A `FrameworkAdapter` recognises a framework's objects and runs them (for `check`);
a `KindAdapter` converts one normalizer kind between that framework and `NormSpec`.
They are real ABCs: a subclass that forgets a method cannot be instantiated.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterable
from importlib import import_module
from typing import Any, ClassVar

import numpy as np

from schemas import LayerReport, NormSpec
from schemas.kinds import KIND_INFO

from .options import ConversionOptions


def owning_framework(obj: Any, frameworks: Iterable[str]) -> str | None:
    """Which of `frameworks` owns `obj`: the first class of its MRO defined in one of their packages.

    A framework's name is the top-level package its objects come from (torch, keras, onnx), so
    only the classes' module names are read and no framework is imported to tell. The most
    derived class decides: a user's subclass of a torch module is a torch object.
    """
    names = set(frameworks)
    for cls in type(obj).__mro__:
        package = (getattr(cls, "__module__", "") or "").partition(".")[0]
        if package in names:
            return package
    return None


class KindAdapter(abc.ABC):
    """framework object <-> NormSpec for one (framework, kind) pair, and nothing else."""

    framework: ClassVar[str]
    kind: ClassVar[str]
    #: The settings beyond schema version 1 (NormSpec.extended_settings: compute_dtype, scale_offset,
    #: frozen, bfloat16, a channel-axis layout for trailing kinds...) this adapter's from_spec honours.
    #: A spec using any other is refused before from_spec runs, so nothing is dropped silently.
    holds: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        """Read `obj` into a spec; note anything surprising in `report`."""

    @abc.abstractmethod
    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        """Build the framework's natural layer for `spec`, recording every translation in `report`.

        Raises NotExpressibleError when the framework cannot hold a setting faithfully.
        """


def kind_adapters(package: str) -> dict[str, type[KindAdapter]]:
    """kind -> the `ADAPTER` of module `<package>.<kind>`, for every kind of the vocabulary that has one.

    A framework package builds its KIND_ADAPTERS with this, so a new kind needs a module, not a table
    entry. A kind without a module is left out here and fails
    tests/converters/test_registry.py::test_every_framework_has_an_adapter_for_every_kind; a module that
    exists but fails to import raises.
    """
    found: dict[str, type[KindAdapter]] = {}
    for kind in KIND_INFO:
        name = f"{package}.{kind}"
        try:
            module = import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            continue
        found[kind] = module.ADAPTER
    return found


class FrameworkAdapter(abc.ABC):
    """Recognise, describe and run one framework's normalization objects."""

    name: ClassVar[str]
    #: The framework stores scalar attributes (eps, momentum) as float32 (ONNX does): a
    #: float64 layer's training step then uses float32(momentum), a difference check allows for.
    float32_attributes: ClassVar[bool] = False

    def owns(self, obj: Any) -> bool:
        """Whether `obj` is an object of this framework (cheap; never imports the framework).

        Its classes must come from the framework's package; a subclass may ask for more (a torch.nn.Module).
        """
        return owning_framework(obj, (self.name,)) == self.name

    @abc.abstractmethod
    def kind_of(self, obj: Any) -> str:
        """The normalizer kind of `obj`; UnsupportedObjectError if it is not one."""

    def recognised_spec(self, obj: Any) -> NormSpec | None:
        """The spec a recognizer proved for `obj` by what it computes (a class no kind adapter reads), else None."""
        return None

    def restore(self, spec: NormSpec) -> tuple[Any, str]:
        """(the class `spec` was read from, rebuilt and proved equal; how) or (None, why not): a framework that can
        rebuild a source class (torch: torch_adapter/restoring.py) overrides this."""
        return None, f"{self.name} layers are always converted to their stock class"

    @abc.abstractmethod
    def version(self) -> str:
        """The framework's version string, for provenance."""

    @abc.abstractmethod
    def natural_layout(self) -> str | None:
        """Where this framework's natural layers keep channels (channels_first/channels_last)."""

    @abc.abstractmethod
    def run_eval(self, obj: Any, x: np.ndarray, in_place: bool = False) -> np.ndarray:
        """Eval-mode output of `obj` on `x` (in the object's own layout), without changing its state.

        `in_place`: the caller owns `obj` and resets whatever running it changes (converters/gate/group_objects.py),
        so no copy is made.
        """

    @abc.abstractmethod
    def run_train_step(
        self, obj: Any, x: np.ndarray, in_place: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """One training-mode forward pass: (output, new running_mean, new running_var), on a copy
        (on `obj` itself if `in_place`)."""

    def unchanged_objects(self) -> contextlib.AbstractContextManager:
        """A block in which the caller changes none of the objects it hands this framework (check_many, over the objects
        it wrote): the framework may read each once there (ONNX: onnx_adapter/reading.models_unchanged). Default:
        no effect."""
        return contextlib.nullcontext()

    def kept_runs(self, obj: Any) -> Any:
        """An object whose `run_eval(x)` and `run_train_step(x)` give what `run_eval(obj, x, in_place=True)` and
        `run_train_step(obj, x, in_place=True)` give, bit for bit, at less cost to a caller that runs `obj` again and
        again with its state changed in between (check_many's GroupObjects); None where running `obj` directly costs no
        more. It also has `run_eval_and_train_step(x)` (both, from one state) and `run_with_next_write(x)` (the next
        write runs both on `x` and hands them over): keras_adapter/traced.TracedCalls."""
        return None
