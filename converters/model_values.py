"""What the model adapters and the whole-model tools hand each other: layer references, facts, inputs, runners, moments.

These are plain values with no framework in them, so the tools (converters/models/) and the
framework packages both import them from here and never each other's modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas import NormSpec

Outputs = list[np.ndarray]


@dataclass(frozen=True)
class NormLayerRef:
    """One normalization layer inside a model: its path (torch) or name (Keras) and the object.

    `training` is the layer's own mode where it has one (a PyTorch module's `training`); Keras
    chooses the mode per call, so its layers say False.
    """

    path: str
    obj: Any
    framework: str
    kind: str
    training: bool = False


@dataclass(frozen=True)
class LayerFacts:
    """What inspection found about one layer, in terms every hazard can read.

    `framework` decides whose defaults apply (torch, keras or onnx); `origin` where the layer
    was found. `training` is the layer's mode where it has one that matters. `eps` is given
    separately for ONNX sites whose spec could not be built.
    """

    path: str
    kind: str
    framework: str
    origin: str
    layer_type: str
    spec: NormSpec | None
    training: bool = False
    eps: float | None = None
    native: bool = True
    folded: bool = False
    op_types: tuple[str, ...] = ()
    problem: str | None = None

    @property
    def tracked(self) -> bool:
        return self.spec is not None and self.spec.track_running_stats


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, shape (None where the model accepts any size) and NumPy dtype name."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str


class ModelRunner:
    """A model as a function from a tuple of input arrays to a list of output arrays."""

    def __init__(
        self,
        run: Callable[[Sequence[np.ndarray]], Outputs],
        description: str,
        specs: list[InputSpec],
        findings: list[str] | None = None,
        output_names: list[str] | None = None,
        runtime: str = "",
    ):
        self.run, self.description, self.specs = run, description, specs
        self.findings = findings or []
        self.output_names = output_names
        self.runtime = runtime

    def __call__(self, arrays: Sequence[np.ndarray]) -> Outputs:
        return [np.asarray(o) for o in self.run(arrays)]


@dataclass
class LayerMoments:
    """Per-batch moments of one BatchNorm layer's input (float64), with the layer's frozen statistics."""

    name: str
    running_mean: np.ndarray
    running_var: np.ndarray
    eps: float
    counts: list[int] = field(default_factory=list)
    means: list[np.ndarray] = field(default_factory=list)
    variances: list[np.ndarray] = field(default_factory=list)  # biased (ddof=0) within each batch
    batches_tracked: int | None = None  # num_batches_tracked where the format keeps it (torch), else None
    momentum: float | None = None  # torch convention (weight of a new batch); None when unknown or a cumulative average

    @property
    def channels(self) -> int:
        return int(self.running_mean.shape[0])

    def add(self, x: np.ndarray, axis: int) -> None:
        """Record one batch of layer input `x` whose channels are on `axis`."""
        x = np.asarray(x, dtype=np.float64)
        axes = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
        self.counts.append(int(np.prod([x.shape[i] for i in axes])))
        mean = x.mean(axis=axes)
        self.means.append(mean)
        self.variances.append(np.square(x - np.expand_dims(mean, axes)).mean(axis=axes))

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and population variance over every batch together."""
        counts = np.asarray(self.counts, dtype=np.float64)[:, None]
        means, variances = np.stack(self.means), np.stack(self.variances)
        mean = (counts * means).sum(0) / counts.sum()
        var = (counts * (variances + np.square(means - mean))).sum(0) / counts.sum()
        return mean, var


#: One recalibrated layer: (name, old mean, old var, new mean, new var, eps).
Movement = tuple[str, Any, Any, Any, Any, float]


def population_statistics(moments: LayerMoments, variance_estimator: str = "unbiased") -> tuple[np.ndarray, np.ndarray]:
    """A layer's new running statistics: the mean and variance of its input over every value of every batch (float64).

    Pooled with Chan's parallel formula (LayerMoments.pooled), so they are the data's own whatever the batch size; the
    unbiased estimator multiplies the population variance by n / (n - 1) for the n values per channel in all.
    """
    from schemas import InputFileError

    mean, var = moments.pooled()
    if variance_estimator == "unbiased":
        total = float(sum(moments.counts))
        if total < 2:
            raise InputFileError(
                f"layer '{moments.name}': one value per channel in all the data has no unbiased variance; pass at least 2 samples."
            )
        var = var * total / (total - 1)
    return mean, var


def first_line(error: BaseException) -> str:
    """The first line of an error's message (at most 300 characters), for one-sentence errors."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
