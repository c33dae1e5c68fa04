"""An index over one ONNX graph for the pattern matchers: producers, consumers, constants, shapes.

Exporters store the constants of a decomposition either as initializers (torch.onnx, tf2onnx)
or as Constant nodes (onnx's version converter turns ReduceMean axes into them), so both are
one table here. Shapes come from onnx's shape inference with data propagation, which is what
resolves tf2onnx's Shape -> Slice -> Concat chains; a dim it cannot resolve is a symbolic
`Dim` token, equal for two tensors only when it provably is the same dim (followed through
Transposes and shape-preserving unary ops).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas.kinds import KIND_INFO

from ..proto import DEFAULT_DOMAINS, FLOAT_TYPES, opset_of
from .folding import fold_with_shapes, folded

#: Unary ops whose output has their input's shape: a dim of the output is the input's dim.
SHAPE_PRESERVING = frozenset(
    {
        "Identity",
        "Cast",
        "Relu",
        "Neg",
        "Sigmoid",
        "Tanh",
        "Erf",
        "Abs",
        "Sqrt",
        "Reciprocal",
        "Exp",
        "LeakyRelu",
        "Clip",
        "HardSigmoid",
        "Softplus",
    }
)
#: Ops whose first output has the type and shape of their first input.
SAME_TYPE_AND_SHAPE = (
    (SHAPE_PRESERVING - {"Cast"})
    | {info.onnx_op for info in KIND_INFO.values() if info.onnx_op}
    | {"Softmax", "Dropout"}
)


@dataclass(frozen=True)
class Dim:
    """A dim whose value shape inference could not fix: dim `axis` of tensor `tensor` (canonicalised)."""

    tensor: str
    axis: int


DimValue = int | Dim


def attribute(node: onnx.NodeProto, name: str, default=None):
    """The node's attribute `name` as a Python value, or `default`."""
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


class GraphIndex:
    """Read-only views of a model's main graph that every matcher needs."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.nodes = list(model.graph.node)
        self.opset = opset_of(model)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = index
            for name in list(node.input) + sorted(subgraph_reads(node)):
                if name:
                    self.consumers.setdefault(name, []).append(index)
        self._int_cache: dict[
            str, tuple[int, int, list | None]
        ] = {}  # int_values: name -> (constants known, depth, value)
        self.graph_outputs = frozenset(o.name for o in model.graph.output)
        self.graph_inputs = frozenset(i.name for i in model.graph.input)
        self.constants: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for node in self.nodes:
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS and len(node.output) == 1:
                value = _constant_value(node)
                if value is not None:
                    self.constants[node.output[0]] = value
            elif (
                node.domain in DEFAULT_DOMAINS
                and len(node.output) == 1
                and node.input
                and all(n in self.constants for n in node.input if n)
            ):
                value = folded(node, [self.constants.get(n) for n in node.input])
                if value is not None:
                    self.constants[node.output[0]] = value
        self._types: dict[str, onnx.TypeProto] = {}
        self._infer_types(model)
        self._dims_cache: dict[str, tuple[DimValue, ...] | None] = {}
        fold_with_shapes(self)

    # -- types and shapes ------------------------------------------------------------------

    def _infer_types(self, model: onnx.ModelProto) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(_without_weights(model), strict_mode=False, data_prop=True)
        # onnx raises several types for graphs it cannot infer (custom domains): use declared types
        except Exception:  # noqa: BLE001
            inferred = model
        for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                self._types.setdefault(value.name, value.type)
        # onnx's inference stops at ops it cannot infer (GroupNormalization-21 inside a larger graph):
        # ops whose output has their input's type and shape carry it on.
        for node in self.nodes:
            if (
                node.op_type in SAME_TYPE_AND_SHAPE
                and node.input
                and node.input[0] in self._types
                and node.output
                and node.output[0] not in self._types
            ):
                self._types[node.output[0]] = self._types[node.input[0]]

    def elem_type(self, name: str) -> int | None:
        if name in self.constants:
            return helper.np_dtype_to_tensor_dtype(self.constants[name].dtype)
        kind = self._types.get(name)
        if kind is None or not kind.HasField("tensor_type"):
            return None
        return kind.tensor_type.elem_type or None

    def dtype(self, name: str) -> str | None:
        """'float16', 'float32' or 'float64' for a float tensor, else None."""
        return FLOAT_TYPES.get(self.elem_type(name))

    def rank(self, name: str) -> int | None:
        dims = self.dims(name)
        return None if dims is None else len(dims)

    def dims(self, name: str) -> tuple[DimValue, ...] | None:
        """The tensor's dims: ints where known, canonical `Dim` tokens elsewhere; None if the rank is unknown."""
        if name in self._dims_cache:
            return self._dims_cache[name]
        self._dims_cache[name] = None  # guards against cycles in malformed graphs
        result: tuple[DimValue, ...] | None = None
        if name in self.constants:
            result = tuple(int(d) for d in self.constants[name].shape)
        else:
            kind = self._types.get(name)
            if kind is not None and kind.HasField("tensor_type") and kind.tensor_type.HasField("shape"):
                dims = []
                for axis, dim in enumerate(kind.tensor_type.shape.dim):
                    dims.append(int(dim.dim_value) if dim.HasField("dim_value") else self.canonical_dim(name, axis))
                result = tuple(dims)
        self._dims_cache[name] = result
        return result

    def canonical_dim(self, name: str, axis: int) -> Dim:
        """The token of an unknown dim, followed back through Transposes and shape-preserving ops."""
        seen = 0
        while name in self.producer and seen < 1000:
            seen += 1
            node = self.nodes[self.producer[name]]
            if node.domain not in DEFAULT_DOMAINS:
                break
            if node.op_type == "Transpose":
                perm = attribute(node, "perm")
                if perm is None or axis >= len(perm):
                    break
                name, axis = node.input[0], int(perm[axis])
            elif node.op_type in SHAPE_PRESERVING:
                name = node.input[0]
            else:
                break
        return Dim(name, axis)

    # -- constants and integer (shape) expressions ----------------------------------------

    def constant(self, name: str) -> np.ndarray | None:
        return self.constants.get(name) if name else None

    def int_values(self, name: str, depth: int = 0) -> list[DimValue] | None:
        """A 1-D int tensor as a list of dims (ints or Dim tokens), following Shape/Gather/Slice/Concat/Cast; else None.

        Remembered per tensor while the known constants are unchanged (folding adds some): without it, asking about a
        float tensor walks every Add of a residual stream up to the depth limit, along both inputs of each, which
        took minutes on a 12-layer decoder. A None found with `depth` steps used holds for any deeper question."""
        cache = self._int_cache
        hit = cache.get(name)
        if hit is not None and hit[0] == len(self.constants) and (hit[2] is not None or depth >= hit[1]):
            return None if hit[2] is None else list(hit[2])
        value = self._int_values(name, depth)
        cache[name] = (len(self.constants), depth, None if value is None else list(value))
        return value

    def _int_values(self, name: str, depth: int) -> list[DimValue] | None:
        if depth > 32:
            return None
        array = self.constant(name)
        if array is not None:
            if array.dtype.kind not in "iu" or array.ndim > 1:
                return None
            return [int(v) for v in np.atleast_1d(array)]
        if name not in self.producer:
            return None
        node = self.nodes[self.producer[name]]
        if node.domain not in DEFAULT_DOMAINS:
            return None
        op = node.op_type
        if op == "Shape":
            dims = self.dims(node.input[0])
            if dims is None:
                return None
            start, end = attribute(node, "start", 0), attribute(node, "end", None)
            return list(dims[slice(start, end)])
        if op in ("Cast", "Identity"):
            if op == "Cast" and attribute(node, "to") not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
                return None
            return self.int_values(node.input[0], depth + 1)
        if op == "Concat":
            parts = [self.int_values(i, depth + 1) for i in node.input]
            if any(p is None for p in parts):
                return None
            return [d for p in parts for d in p]
        if op == "Gather":
            data, indices = self.int_values(node.input[0], depth + 1), self.constant(node.input[1])
            if data is None or indices is None or attribute(node, "axis", 0) != 0 or indices.ndim > 1:
                return None
            try:
                return [data[int(i)] for i in np.atleast_1d(indices)]
            except IndexError:
                return None
        if op == "Slice":
            data = self.int_values(node.input[0], depth + 1)
            bounds = [self.constant(i) if i else None for i in list(node.input[1:]) + [""] * (4 - len(node.input[1:]))]
            if data is None or bounds[0] is None or bounds[1] is None:
                return None
            if bounds[2] is not None and [int(a) for a in np.atleast_1d(bounds[2])] not in ([0], [-1]):
                return None
            step = 1 if bounds[3] is None else int(np.atleast_1d(bounds[3])[0])
            start, end = int(np.atleast_1d(bounds[0])[0]), int(np.atleast_1d(bounds[1])[0])
            return list(data[slice(start, end, step)])
        if op in ("Unsqueeze", "Squeeze"):
            return self.int_values(node.input[0], depth + 1)
        return self._int_arithmetic(node, depth)

    def _int_arithmetic(self, node: onnx.NodeProto, depth: int) -> list[DimValue] | None:
        """Size, Range and elementwise Add/Sub/Mul/Div of known ints: what ONNX's function bodies compute axes with
        (RMSNormalization's Range(axis, Size(Shape(X)), 1), GroupNormalization's C / G)."""
        op = node.op_type
        if op == "Size":
            dims = self.dims(node.input[0])
            return None if dims is None or not all(isinstance(d, int) for d in dims) else [int(np.prod(dims))]
        values = [self.int_values(name, depth + 1) for name in node.input]
        if any(v is None or not all(isinstance(d, int) for d in v) for v in values):
            return None
        if op == "Range" and all(len(v) == 1 for v in values):
            (start,), (limit,), (delta,) = values
            return list(range(start, limit, delta)) if delta and abs((limit - start) // delta) <= 64 else None
        if op in ("Add", "Sub", "Mul", "Div") and len(values) == 2:
            a, b = values
            if len(a) != len(b) and 1 not in (len(a), len(b)):
                return None
            a, b = (a * len(b) if len(a) == 1 else a), (b * len(a) if len(b) == 1 else b)
            if op == "Div" and any(y == 0 or x % y for x, y in zip(a, b)):
                return None
            combine = {
                "Add": lambda x, y: x + y,
                "Sub": lambda x, y: x - y,
                "Mul": lambda x, y: x * y,
                "Div": lambda x, y: x // y,
            }[op]
            return [combine(x, y) for x, y in zip(a, b)]
        return None

    # -- graph walking --------------------------------------------------------------------

    def producer_node(self, name: str) -> onnx.NodeProto | None:
        index = self.producer.get(name)
        return None if index is None else self.nodes[index]

    def consumer_nodes(self, name: str) -> list[int]:
        return self.consumers.get(name, [])

    def single_consumer(self, name: str) -> int | None:
        """The one node consuming `name`, when there is exactly one and `name` is not a graph output."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.graph_outputs:
            return None
        return users[0]

    def default_domain(self, index: int) -> bool:
        return self.nodes[index].domain in DEFAULT_DOMAINS


#: Initializers up to this many elements keep their data for shape inference (shape constants, axes).
SMALL_INITIALIZER = 64


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for shape inference: large initializers become typed graph inputs, so a 100 MB
    model is not serialised for the C++ inference (only their shapes and types matter)."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    declared = {value.name for value in model.graph.input}
    for tensor in model.graph.initializer:
        if int(np.prod(tensor.dims)) <= SMALL_INITIALIZER or tensor.data_location == onnx.TensorProto.EXTERNAL:
            graph.initializer.append(tensor)
        elif tensor.name not in declared:
            graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    for function in model.functions:
        light.functions.append(function)
    return light


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names the bodies of an If/Loop/Scan node read (outer tensors they capture count as consumed by the node)."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = (
            [attr.g]
            if attr.type == onnx.AttributeProto.GRAPH
            else list(attr.graphs)
            if attr.type == onnx.AttributeProto.GRAPHS
            else []
        )
        for graph in graphs:
            for inner in graph.node:
                names.update(n for n in inner.input if n)
                names |= subgraph_reads(inner)
    return names


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None


def resolve_reshape(target: list[DimValue], source: tuple[DimValue, ...], allowzero: int = 0) -> list[DimValue] | None:
    """Reshape's target with 0 (copy) resolved; -1 stays -1 (inferred); None if unusable."""
    if target.count(-1) > 1:
        return None
    resolved = []
    for index, dim in enumerate(target):
        if isinstance(dim, int) and dim == 0 and not allowzero:
            if index >= len(source):
                return None
            resolved.append(source[index])
        elif isinstance(dim, int) and dim < -1:
            return None
        else:
            resolved.append(dim)
    return resolved


def shape_chain(index: GraphIndex, name: str, limit: int = 16) -> list[int]:
    """Nodes computing an integer shape tensor (Shape, Gather, Cast, Slice, Concat, ...)."""
    nodes, stack = [], [name]
    while stack and len(nodes) < limit:
        tensor = stack.pop()
        i = index.producer.get(tensor)
        if i is None or i in nodes or index.nodes[i].op_type == "Constant":
            continue
        node = index.nodes[i]
        if node.op_type not in ("Shape", "Gather", "Cast", "Slice", "Concat", "Unsqueeze", "Squeeze", "Identity"):
            continue
        nodes.append(i)
        if node.op_type != "Shape":
            stack.extend(n for n in node.input if n)
    return nodes


def same_shape(index: GraphIndex, shape_tensor: str, reference: str) -> bool:
    """The Reshape target `shape_tensor` provably gives the shape of `reference` (0 only for the batch dim, one -1)."""
    target, dims = index.int_values(shape_tensor), index.dims(reference)
    if target is None or dims is None or len(target) != len(dims) or target.count(-1) > 1:
        return False
    return all(t == d or t == -1 or (p == 0 and t == 0) for p, (t, d) in enumerate(zip(target, dims)))


def fresh_name(taken: set[str], base: str) -> str:
    """`base`, or `base_N` for the smallest N not in `taken`; the name is added to `taken`
    (graph edits never collide)."""
    name, count = base, 0
    while name in taken:
        count += 1
        name = f"{base}_{count}"
    taken.add(name)
    return name
