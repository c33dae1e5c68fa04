"""The order in which recalibration finalizes BatchNorm layers, shared by the framework adapters.

A layer's new statistics are the population moments of its input over all the data, with every BatchNorm upstream of
it already in eval mode on its own new statistics: what the recalibrated model computes when it serves (issue 34:
train-mode passes over small batches gave statistics that `drift` then flagged on the same data). So the layers are
finalized in waves, one pass over the data each: a wave holds every pending layer none of whose upstream layers is
pending. Where the adapter reads the graph (a program's FX graph, an ONNX graph, a functional Keras model) a wave holds
every layer of one depth (a ResNet's shortcut BatchNorm shares its pass with its block's first); where it cannot (an
nn.Module) each layer is a wave of its own, in execution order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import AbstractSet

from schemas import UnsupportedObjectError

#: One step of a graph in topological order: (names it reads, names it writes, the BatchNorm layer it is, or None).
Step = tuple[Iterable[str], Iterable[str], "str | None"]


def upstream_layers(steps: Iterable[Step]) -> dict[str, set[str]]:
    """For each BatchNorm layer, the layers whose output reaches its input. A step writing a name it also reads (an
    in-place op) adds to what reaches that name, so its later readers depend on what was written into it."""
    reach: dict[str, frozenset[str]] = {}
    upstream: dict[str, set[str]] = {}
    for inputs, outputs, layer in steps:
        above = frozenset().union(*(reach.get(name, frozenset()) for name in inputs))
        if layer is not None:
            upstream.setdefault(layer, set()).update(above)
            above = above | {layer}
        for name in outputs:
            reach[name] = reach.get(name, frozenset()) | above
    return upstream


def waves(order: Sequence[str], upstream: Mapping[str, AbstractSet[str]] | None = None) -> Iterator[list[str]]:
    """Successive lists of layers to measure in one pass each; the caller finalizes a list before asking for the next.

    Args:
        order: every layer to recalibrate, in execution order.
        upstream: per layer, the layers whose output reaches its input; None when unknown (one layer per wave).
    """
    if upstream is not None:
        for name in order:
            if name in upstream.get(name, ()):
                raise UnsupportedObjectError(
                    f"layer '{name}' runs more than once per forward and its own output reaches a later use of it, so its statistics feed "
                    "its own input and have no population value; give each use its own BatchNorm before recalibrating."
                )
    pending, done = list(order), set()
    while pending:
        wave = (
            pending[:1] if upstream is None else [name for name in pending if not (set(upstream.get(name, ())) - done)]
        )
        if not wave:  # reach is transitive, so a cycle shows as a self-loop above; this guards the loop all the same
            raise UnsupportedObjectError(
                f"layers {', '.join(repr(n) for n in pending[:3])} feed one another's inputs; give each use its own BatchNorm."
            )
        yield wave
        done.update(wave)
        pending = [name for name in pending if name not in done]


__all__ = ["Step", "upstream_layers", "waves"]
