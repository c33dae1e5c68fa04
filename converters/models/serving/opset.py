"""Holding an exported graph to the opset the user asked for (`export --opset N`).

An exporter may write a newer opset than asked: torch.onnx's dynamo exporter has no
implementations below opset 18 (torch/onnx/_internal/exporter/_constants.py, TORCHLIB_OPSET), so
it exports at 18, tries onnxscript's converter, logs a traceback when that fails and keeps 18.
Here the graph is taken down with onnx's own version converter, or refused with the reason: a
file above the cap would not load in the runtime the cap was chosen for.

onnx's converter (1.23) moves ReduceX's `axes` input back into an attribute but keeps the opset-18
attribute `noop_with_empty_axes`, which opset 13 does not know; with constant, non-empty axes that
attribute changes nothing, so it is dropped first.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from schemas import UnsupportedObjectError

#: Reductions whose `axes` became an input at opset 18 (ReduceSum at 13, before any cap we accept).
AXES_INPUT_REDUCTIONS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _constant_axes(model: onnx.ModelProto) -> dict[str, int]:
    """Name -> number of elements of every initializer and Constant output (the axes inputs the converter can read)."""
    sizes = {t.name: int(numpy_helper.to_array(t).size) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute:
            value = node.attribute[0]
            if value.type == onnx.AttributeProto.TENSOR:
                sizes[node.output[0]] = int(numpy_helper.to_array(value.t).size)
    return sizes


def _drop_noop_attribute(model: onnx.ModelProto) -> None:
    """Remove `noop_with_empty_axes` from reductions whose axes are a non-empty constant (it has no effect there)."""
    sizes = _constant_axes(model)
    for node in model.graph.node:
        if node.op_type not in AXES_INPUT_REDUCTIONS or len(node.input) < 2 or sizes.get(node.input[1], 0) == 0:
            continue
        kept = [a for a in node.attribute if a.name != "noop_with_empty_axes"]
        del node.attribute[:]
        node.attribute.extend(kept)


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]


def exporter_opset(cap: int) -> tuple[int, list[str]]:
    """(the opset to ask the exporter for, notes): `cap`, or the newest opset the installed onnx knows when `cap` is
    beyond it.

    Asked for an opset newer than onnx knows, torch.onnx exports at its own 18, fails to convert up (logging a
    traceback) and keeps 18 without a word; asked for onnx's newest instead, it writes that.
    """
    newest = onnx.defs.onnx_opset_version()
    if cap <= newest:
        return cap, []
    return newest, [
        f"onnx {onnx.__version__} knows opsets up to {newest}; the exporter was asked for {newest}, within the --opset {cap} cap"
    ]


def cap_opset(model: onnx.ModelProto, cap: int) -> tuple[onnx.ModelProto, list[str]]:
    """`model` at opset <= `cap` (a converted copy, with notes), or UnsupportedObjectError saying why it cannot be.

    Node metadata (torch.onnx's module scopes, which name the normalization sites) is dropped by
    the converter and put back by node name.
    """
    current = _opset(model)
    if current <= cap:
        return model, []
    candidate = onnx.ModelProto()
    candidate.CopyFrom(model)
    _drop_noop_attribute(candidate)
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(candidate, cap)
        onnx.checker.check_model(converted)
    # the converter raises RuntimeError, ValidationError or InferenceError for ops it cannot move
    except Exception as error:  # noqa: BLE001
        raise UnsupportedObjectError(
            f"the exporter wrote opset {current} and onnx's version converter cannot take the graph down to --opset {cap} "
            f"({type(error).__name__}: {_first_line(error)}); pass a higher --opset ({current}, the exporter's own, needs no conversion)."
        ) from None
    metadata = {node.name: node.metadata_props for node in model.graph.node if node.name and len(node.metadata_props)}
    for node in converted.graph.node:
        if node.name in metadata and not len(node.metadata_props):
            node.metadata_props.extend(metadata[node.name])
    converted.ir_version = max(converted.ir_version, helper.find_min_ir_version_for(list(converted.opset_import)))
    return converted, [
        f"the exporter wrote opset {current}; converted down to opset {cap} (--opset) with onnx's version converter"
    ]


__all__ = ["cap_opset", "exporter_opset"]
