"""Constant folding for the matchers: layout-only ops on constants, and what needs the inferred shapes too.

Exporters and ONNX's function bodies shape a scale before multiplying (Flatten, Reshape, Unsqueeze along
axes computed from X's rank, Expand(CastLike(1.0, x))): folded here, those are the constants the
recognizers read. Nothing is executed but NumPy reshapes and casts of small arrays.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..proto import DEFAULT_DOMAINS


def _attribute(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def folded(node: onnx.NodeProto, inputs: list[np.ndarray | None]) -> np.ndarray | None:
    """The value of a layout-only op on constants (Flatten, Reshape, Cast, Squeeze, Unsqueeze, Identity): how ONNX's
    function bodies and exporters shape a scale before multiplying; None for any other op."""
    op, data = node.op_type, inputs[0]
    try:
        if op == "Identity":
            return data
        if op == "Cast":
            return data.astype(helper.tensor_dtype_to_np_dtype(_attribute(node, "to")))
        if op == "CastLike" and len(inputs) == 2 and inputs[1] is not None:
            return data.astype(inputs[1].dtype)
        if op == "Expand" and len(inputs) == 2 and inputs[1] is not None and data.size <= 1:
            return np.broadcast_to(data, np.broadcast_shapes(data.shape, tuple(int(d) for d in inputs[1]))).copy()
        if op == "Flatten":
            axis = _attribute(node, "axis", 1)
            axis = axis + data.ndim if axis < 0 else axis
            return data.reshape(int(np.prod(data.shape[:axis])), -1)
        if op == "Reshape" and len(inputs) == 2 and inputs[1] is not None:
            shape = [int(d) for d in inputs[1]]
            shape = [
                data.shape[i] if d == 0 and not _attribute(node, "allowzero", 0) else d for i, d in enumerate(shape)
            ]
            return data.reshape(shape)
        if op in ("Squeeze", "Unsqueeze"):
            axes = _attribute(node, "axes")
            if axes is None and len(inputs) > 1 and inputs[1] is not None:
                axes = [int(a) for a in np.atleast_1d(inputs[1])]
            if op == "Squeeze":
                return np.squeeze(data, axis=None if axes is None else tuple(axes))
            return np.expand_dims(data, tuple(axes)) if axes is not None else None
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return None


def fold_with_shapes(index) -> None:  # index: a GraphIndex whose types are inferred
    """Fold what needs the inferred types or integer shape expressions too: torch.onnx's optimize=False graphs build a
    GroupNorm's unit scale as Expand(CastLike(1.0, x), [G]) and unsqueeze its weight along axes computed by Range."""
    for node in index.nodes:
        if (
            node.domain not in DEFAULT_DOMAINS
            or len(node.output) != 1
            or node.output[0] in index.constants
            or not node.input
        ):
            continue
        if node.op_type not in ("CastLike", "Expand", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Cast", "Identity"):
            continue
        inputs: list[np.ndarray | None] = []
        for position, name in enumerate(node.input):
            value = index.constants.get(name) if name else None
            if value is None and name and position > 0:
                if node.op_type == "CastLike":
                    target = helper.tensor_dtype_to_np_dtype(index.elem_type(name)) if index.elem_type(name) else None
                    value = None if target is None else np.zeros(0, dtype=target)
                else:
                    ints = index.int_values(name)
                    value = (
                        np.array(ints, dtype=np.int64)
                        if ints is not None and all(isinstance(d, int) for d in ints)
                        else None
                    )
            inputs.append(value)
        if any(v is None for v, name in zip(inputs, node.input) if name):
            continue
        value = folded(node, inputs)
        if value is not None:
            index.constants[node.output[0]] = value
    # A folded node reads nothing at run time (CastLike reads its second input for the type only): it consumes nothing.
    done = {
        i
        for i, node in enumerate(index.nodes)
        if node.op_type != "Constant" and node.output and all(o in index.constants for o in node.output)
    }
    if done:
        index.consumers = {name: [i for i in users if i not in done] for name, users in index.consumers.items()}
