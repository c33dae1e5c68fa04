"""What every matcher reports: a `Match`, with its eps read back, its exporter and its name."""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx

from schemas.floats import shortest_float32_decimal

from .index import GraphIndex

PRODUCERS = {"pytorch": "torch.onnx", "tf2onnx": "tf2onnx", "normbridge": "normbridge"}


@dataclass
class Match:
    """One normalization found in a graph, with what a rewrite into the native op needs.

    `frame[p]` is the input axis held by position p of the output (identity unless the
    decomposition transposed its data). Trailing kinds carry `axes` (input axes normalised, in
    output order) and `scale`/`bias` over them; channel kinds carry `channel_axis` and
    per-channel `scale`/`bias`.
    """

    kind: str
    native: bool
    origin: str
    name: str
    nodes: list[int]
    input: str
    output: str
    eps: float | None = None
    dtype: str | None = None
    rank: int | None = None
    frame: tuple[int, ...] | None = None
    axes: tuple[int, ...] | None = None
    channel_axis: int | None = None
    groups: int | None = None
    dims: tuple[int, ...] | None = None
    scale: np.ndarray | None = field(default=None, repr=False)
    bias: np.ndarray | None = field(default=None, repr=False)
    training_mode: bool = False
    #: Scale or bias operands that are not constants (graph inputs, computed): part of the layer, values unknown.
    affine_inputs: tuple[str, ...] = ()
    folded: bool = False
    folded_constants: tuple[np.ndarray, np.ndarray | None] | None = field(default=None, repr=False)

    @property
    def start(self) -> int:
        return min(self.nodes)


# -- eps ------------------------------------------------------------------------------------


def recover_eps(value: float, dtype: str) -> float:
    """The eps a user wrote: the shortest decimal of a float32/float16 constant, a float64 one exactly."""
    if dtype == "float64":
        return float(value)
    if dtype == "float16":
        return float(np.format_float_scientific(np.float16(value), unique=True, trim="-"))
    return shortest_float32_decimal(value)


# -- naming and origin ----------------------------------------------------------------------


def origin_of(index: GraphIndex, nodes: list[int]) -> str:
    """The exporter whose decomposition this is: the model's producer, else the style of the ops."""
    producer = PRODUCERS.get(index.model.producer_name)
    if producer:
        return producer
    ops = {index.nodes[i].op_type for i in nodes}
    if ops & {"GlobalAveragePool", "Neg"}:
        return "tf2onnx"
    if "Div" in ops:
        return "normbridge"
    return "torch.onnx"


def _torch_scope(node: onnx.NodeProto) -> str | None:
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            if isinstance(scopes, list) and len(scopes) >= 2 and scopes[-2]:
                return str(scopes[-2])
    return None


def site_name(index: GraphIndex, nodes: list[int], output: str) -> str:
    """A name for a decomposition: torch's module path, else the common scope of the node names, else the output."""
    scopes = [s for s in (_torch_scope(index.nodes[i]) for i in nodes) if s]
    if scopes:
        return Counter(scopes).most_common(1)[0][0]
    paths = [index.nodes[i].name.split("/")[:-1] for i in nodes if "/" in index.nodes[i].name]
    if paths:
        common = paths[0]
        for path in paths[1:]:
            length = 0
            while length < min(len(common), len(path)) and common[length] == path[length]:
                length += 1
            common = common[:length]
        if common:
            return "/".join(common)
    return output
