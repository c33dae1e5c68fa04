"""The two abstract interfaces every framework package implements.

A `FrameworkAdapter` recognises a framework's objects and runs them (for `check`);
a `KindAdapter` converts one normalizer kind between that framework and `NormSpec`.
They are real ABCs: a subclass that forgets a method cannot be instantiated.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from schemas import LayerReport, NormSpec

from .options import ConversionOptions


class KindAdapter(abc.ABC):
    """framework object <-> NormSpec for one (framework, kind) pair, and nothing else."""

    framework: ClassVar[str]
    kind: ClassVar[str]

    @abc.abstractmethod
    def to_spec(self, obj: Any, report: LayerReport) -> NormSpec:
        """Read `obj` into a spec; note anything surprising in `report`."""

    @abc.abstractmethod
    def from_spec(self, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
        """Build the framework's natural layer for `spec`, recording every translation in `report`.

        Raises NotExpressibleError when the framework cannot hold a setting faithfully.
        """


class FrameworkAdapter(abc.ABC):
    """Recognise, describe and run one framework's normalization objects."""

    name: ClassVar[str]
    #: The framework stores scalar attributes (eps, momentum) as float32 (ONNX does): a
    #: float64 layer's training step then uses float32(momentum), a difference check allows for.
    float32_attributes: ClassVar[bool] = False

    @abc.abstractmethod
    def owns(self, obj: Any) -> bool:
        """Whether `obj` is an object of this framework (cheap; must not import the framework)."""

    @abc.abstractmethod
    def kind_of(self, obj: Any) -> str:
        """The normalizer kind of `obj`; UnsupportedObjectError if it is not one."""

    @abc.abstractmethod
    def version(self) -> str:
        """The framework's version string, for provenance."""

    @abc.abstractmethod
    def natural_layout(self) -> str | None:
        """Where this framework's natural layers keep channels (channels_first/channels_last)."""

    @abc.abstractmethod
    def run_eval(self, obj: Any, x: np.ndarray) -> np.ndarray:
        """Eval-mode output of `obj` on `x` (in the object's own layout), without changing its state."""

    @abc.abstractmethod
    def run_train_step(self, obj: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """One training-mode forward pass: (output, new running_mean, new running_var), on a copy."""
