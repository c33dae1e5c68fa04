"""What a model adapter hands the serving collector: the model instrumented to report its BatchNorm inputs.

`ModelAdapter.serving_taps(model, sink)` returns `ServingTaps`: the object to serve (the same nn.Module with hooks, a
rewritten program, a session or Keras wrapper returning exactly the served outputs), the layers it reports (name and
frozen statistics, in tap order) and how to take the instrumentation off. The served object tells the `TapSink` when a
request starts (`begin`, which says whether it is sampled), the inputs of a sampled request (`keep`, for the collector's
traffic sample), each sampled layer input's per-channel moments (`observe`) or raw sums (`observe_sums`, cheaper: the
collector's worker thread turns them into moments) and when it ends (`end`). The sink
(converters/models/monitoring/collector.py) never raises into the request path.

The taps also say how the served object is being served, for the collector's serving faults
(schemas.monitoring.ServingFault): `faults()` names what the object computes with batch statistics right now (a torch
BatchNorm in train mode, a graph's training-mode batch-norm op) and `statistics()` reads the running statistics it holds
right now, so the collector can see them change between windows. Both are called off the request path,
once per closed window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


class TapSink(Protocol):
    def begin(self) -> bool:
        """A request starts; True when it is sampled (its layer inputs are to be observed)."""

    def sampling(self) -> bool:
        """Whether the request running in this thread is sampled."""

    def observing(self, index: int) -> bool:
        """Whether layer `index`'s input is to be observed in the request running in this thread
        (taps with per_layer)."""

    def observe(self, index: int, count: int, mean: np.ndarray, var: np.ndarray) -> None:
        """Layer `index`'s input in a sampled request: `count` values per channel,
        their mean and population variance."""

    def observe_sums(self, index: int, count: int, sums: Any, squares: Any) -> None:
        """Layer `index`'s input in a sampled request: `count` values per channel, their per-channel sum and sum of
        squares (arrays or CPU tensors the tap will not touch again; converted off the request thread)."""

    def keep(self, inputs: Any, names: Any = None) -> None:
        """The inputs of the sampled request that just began (copied if a sample is kept): in the model's input order,
        or named by `names` (one per input; a request that passed some inputs by keyword says which it passed)."""

    def failed(self, error: BaseException) -> None:
        """Observing failed (counted; the request goes on)."""

    def end(self) -> None:
        """The request is done."""


@dataclass(frozen=True)
class TappedLayer:
    """One BatchNorm layer the served object reports, with the statistics it froze."""

    name: str
    running_mean: np.ndarray
    running_var: np.ndarray
    eps: float


@dataclass
class ServingTaps:
    served: Any
    layers: list[TappedLayer]
    remove: Callable[[], None] = field(default=lambda: None)
    input_names: list[str] | None = None  # the model's inputs in the order `keep` reports them, when known
    #: The taps see one layer at a time and ask `observing(index)`, so each layer's observations can be drawn apart
    #: (spreading a sampled request's cost over many requests); False where one run yields every layer (sampling()).
    per_layer: bool = False
    #: Why this served object's inputs cannot be kept for a traffic sample (monitor(..., keep_sample=N) refuses it),
    #: or None.
    keep_refusal: str | None = None
    #: (kind, layer, detail) of each way the served object computes batch statistics right now
    #: (schemas.monitoring.FaultKind train_mode or batch_statistics_in_graph); read once per closed window.
    faults: Callable[[], list[tuple[str, str | None, str]]] = field(default=lambda: [])
    #: The (running_mean, running_var) each tapped layer holds right now, in `layers` order, or None where they are
    #: constants of the served object (an ONNX graph, a Keras model's weights as served) and cannot change while
    #: serving.
    statistics: Callable[[], list[tuple[np.ndarray, np.ndarray]]] | None = None


def numpy_moments(x: Any, axis: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(values per channel, per-channel mean, population variance) of an array whose channels are on `axis`,
    in float64."""
    x = np.asarray(x)
    axis = axis % x.ndim
    axes = tuple(i for i in range(x.ndim) if i != axis)
    count = int(x.size // x.shape[axis]) if x.shape[axis] else 0
    return count, x.mean(axis=axes, dtype=np.float64), x.var(axis=axes, dtype=np.float64)


__all__ = ["ServingTaps", "TapSink", "TappedLayer", "numpy_moments"]
