"""Undoing a BatchNorm that an exporter folded into the preceding Conv's kernel, with the source model's kernels.

tf2onnx runs TF's grappler, whose constant folding multiplies each BatchNorm's factor
gamma / sqrt(var + eps) into the Conv kernel (a '.../merged_input' initializer); eps and the
statistics are then gone from the graph. A Conv whose kernel equals a source kernel times that
factor (to float32 rounding) gets the source kernel back, followed by Mul(factor) and
Add(offset): the folded-BatchNorm form that `rewrite.rewrite_decompositions` turns into a native
BatchNormalization with the spec's exact tensors and eps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas import NormSpec

from .index import fresh_name
from .rewrite import folded_constants

#: Relative tolerance of a folded Conv kernel against the source kernel times the BatchNorm factor
#: (TF's grappler folds in float32: a few ulps).
FOLD_RTOL = 16 * 2.0**-24


@dataclass(frozen=True)
class ConvBatchNorm:
    """A source BatchNorm fed directly by a convolution: its name, the kernel in ONNX Conv layout, the conv bias,
    its spec."""

    name: str
    kernel: np.ndarray
    bias: np.ndarray | None
    spec: NormSpec


def _folded_offset(spec: NormSpec, conv_bias: np.ndarray | None, k: np.ndarray) -> np.ndarray:
    """What folding adds after the Conv: conv_bias * k + (beta - mean * k)."""
    offset = folded_constants(spec)[1]
    return offset if conv_bias is None else offset + conv_bias.astype(np.float64) * k


class _Unfolder:
    """Fresh names and initializers in one copy of the graph, and the Conv nodes unfolded in it."""

    def __init__(self, model: onnx.ModelProto, candidates: list[ConvBatchNorm]):
        self.model = onnx.ModelProto()
        self.model.CopyFrom(model)
        self.graph = self.model.graph
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.taken = set(self.initializers) | {
            n for node in self.graph.node for n in list(node.input) + list(node.output)
        }
        self.candidates = list(candidates)

    def fresh(self, base: str) -> str:
        return fresh_name(self.taken, base)

    def constant(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def matching(self, folded: np.ndarray) -> int | None:
        """The position of the candidate whose kernel times its BatchNorm factor is `folded`."""
        for position, candidate in enumerate(self.candidates):
            kernel = candidate.kernel
            if kernel.shape != folded.shape:
                continue
            k = folded_constants(candidate.spec)[0]
            expected = kernel.astype(np.float64) * k.reshape((-1,) + (1,) * (kernel.ndim - 1))
            if np.all(
                np.abs(folded.astype(np.float64) - expected) <= FOLD_RTOL * np.abs(expected) + np.finfo(np.float32).tiny
            ):
                return position
        return None

    def consumers(self, name: str) -> list[onnx.NodeProto]:
        return [n for n in self.graph.node if name in n.input]

    def detached_offset(self, conv: onnx.NodeProto, expected: np.ndarray) -> np.ndarray | None:
        """The folded offset of a bias-less Conv, taken out of the Add that applies it later;
        None when there is no such Add.

        tf2onnx leaves it after a Transpose to channels-last when its transpose optimizer fails
        (MobileNetV3: "max() arg is an empty sequence"), so the Add is not next to the Conv. The
        Add becomes an Identity and the offset moves into the Mul/Add written after the Conv.
        """
        path, channels_last = self.consumers(conv.output[0]), False
        if len(path) == 1 and path[0].op_type == "Transpose":
            perm = _ints(path[0], "perm")
            if perm != [0, *range(2, len(perm)), 1]:
                return None
            path, channels_last = self.consumers(path[0].output[0]), True
        if len(path) != 1 or path[0].op_type != "Add":
            return None
        add = path[0]
        constant = [i for i, name in enumerate(add.input) if name in self.initializers]
        if len(constant) != 1:
            return None
        values = numpy_helper.to_array(self.initializers[add.input[constant[0]]]).astype(np.float64)
        shape = tuple(values.shape)
        along = shape[-1:] if channels_last else shape[-3:-2] if len(shape) >= 3 else ()
        if along != (expected.size,) or values.size != expected.size:
            return None
        values = values.reshape(-1)
        if not np.allclose(values, expected, rtol=1e-5, atol=1e-6 * max(1.0, float(np.max(np.abs(expected))))):
            return None
        add.op_type = "Identity"
        del add.input[constant[0]]
        return values

    def unfold(self, node: onnx.NodeProto) -> tuple[str, list[onnx.NodeProto]] | None:
        """(BatchNorm name, the Mul and Add that follow `node` once its kernel is the source's);
        None when it is not a folded Conv."""
        if (
            node.op_type != "Conv"
            or len(node.input) < 2
            or node.input[1] not in self.initializers
            or not self.candidates
        ):
            return None
        folded = numpy_helper.to_array(self.initializers[node.input[1]])
        position = self.matching(folded)
        if position is None:
            return None
        candidate = self.candidates[position]
        has_bias = len(node.input) > 2 and node.input[2] in self.initializers
        k = folded_constants(candidate.spec)[0]
        if has_bias:
            merged = numpy_helper.to_array(self.initializers[node.input[2]]).astype(np.float64)
        elif np.all(_folded_offset(candidate.spec, candidate.bias, k).astype(folded.dtype) == 0):
            # The folded bias is exactly zero (fresh statistics and a zero conv bias): the exporter
            # dropped the Add of zeros, so there is nothing more to undo than the kernel.
            merged = np.zeros(candidate.kernel.shape[0])
        else:
            merged = self.detached_offset(node, _folded_offset(candidate.spec, candidate.bias, k))
            if merged is None:
                return None  # the conv bias went into a later Add together with the BatchNorm offset: leave it folded
        del self.candidates[position]
        return candidate.name, self._rewire(node, candidate, k, merged, has_bias, folded.dtype)

    def _rewire(self, node, candidate: ConvBatchNorm, k, merged, has_bias: bool, dtype) -> list[onnx.NodeProto]:
        name, kernel, bias = candidate.name, candidate.kernel, candidate.bias
        node.input[1] = self.constant(f"{name}/normbridge_kernel", kernel.astype(dtype))
        if bias is not None:
            conv_bias = self.constant(f"{name}/normbridge_conv_bias", bias.astype(dtype))
            if has_bias:
                node.input[2] = conv_bias
            else:
                node.input.append(conv_bias)
            offset = merged - bias.astype(np.float64) * k
        else:
            if has_bias:
                del node.input[2]
            offset = merged
        output = node.output[0]
        conv_out = self.fresh(f"{name}/normbridge_conv_out")
        node.output[0] = conv_out
        shape = (1, kernel.shape[0]) + (1,) * (kernel.ndim - 2)
        scaled = self.fresh(f"{name}/normbridge_scaled")
        return [
            helper.make_node(
                "Mul",
                [conv_out, self.constant(f"{name}/normbridge_factor", k.reshape(shape).astype(dtype))],
                [scaled],
                name=self.fresh(f"{name}/batchnorm/normbridge_mul"),
            ),
            helper.make_node(
                "Add",
                [scaled, self.constant(f"{name}/normbridge_offset", offset.reshape(shape).astype(dtype))],
                [output],
                name=self.fresh(f"{name}/batchnorm/normbridge_add"),
            ),
        ]


def _ints(node: onnx.NodeProto, name: str) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == name), [])


def unfold_conv_batchnorms(
    model: onnx.ModelProto, candidates: list[ConvBatchNorm]
) -> tuple[onnx.ModelProto, list[str]]:
    """`model` with every Conv that folded one of `candidates` unfolded; (new model, unfolded layer names).

    The input model is not changed; when nothing is unfolded it is returned as it is.
    """
    if not candidates:
        return model, []
    unfolder = _Unfolder(model, candidates)
    nodes, unfolded = [], []
    for node in unfolder.graph.node:
        nodes.append(node)
        found = unfolder.unfold(node)
        if found is not None:
            unfolded.append(found[0])
            nodes.extend(found[1])
    if not unfolded:
        return model, []
    graph = unfolder.graph
    del graph.node[:]
    graph.node.extend(nodes)
    used = {n for node in graph.node for n in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return unfolder.model, unfolded
