"""A library's own operator in a `.pt2` program, kept as an opaque stand-in that is never run.

transformers' MoE layers (DeepSeek-V3, Qwen-MoE, Mixtral) export `transformers::grouped_mm_fallback`; loading that
operator means running the library's registration code, which a file must never make normbridge do. Re-exporting writes
the same operator, so refusing the whole file left no way to read it (issue 34, item 4). Instead, before torch's
deserializer sees the program, each call of an operator outside aten and prims (a plain `torch.ops.NS.NAME.OVERLOAD`
name) whose one output has a static shape is rewritten into a call of `normbridge::opaque_operator`, which keeps the
call's tensor inputs (so what depends on the caller's inputs still does), its output's shape and dtype, and the
operator's name. Its normalizations outside such calls are read and proved as in any program; running the stand-in
raises, naming the operator, so no program computes with it (export, drift and recalibration refuse the file then).
The inspection reports each call as unrecognised (`../recognition/norm_hazards.py`): `register` needs
`--allow-unrecognised`.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from schemas import InputFileError

#: The stand-in's serialized name, accepted by program_checks.py.
TARGET = "torch.ops.normbridge.opaque_operator.default"
_CUSTOM_TARGET = re.compile(r"torch\.ops\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)\.([A-Za-z_]\w*)")
#: How the stand-in's node target prints once loaded.
_LOADED_NAME = "normbridge.opaque_operator.default"
_TORCH_NAMESPACES = frozenset({"aten", "prims", "higher_order", "normbridge"})


def custom_operator(target: Any) -> str | None:
    """'NS::NAME' when `target` names a library's operator (not aten or prims), else None."""
    match = _CUSTOM_TARGET.fullmatch(target) if isinstance(target, str) else None
    if match is None or match.group(1) in _TORCH_NAMESPACES:
        return None
    return f"{match.group(1)}::{match.group(2)}"


def refusal(operator: str, where: str, why: str) -> InputFileError:
    return InputFileError(
        f"{where}: the program calls {operator}, a library's own operator normbridge does not load (loading it could "
        f"run code), and {why}; export the model without it (for transformers MoE models, a model whose experts run "
        "as plain torch ops), or convert and check its normalization layers one by one (normbridge convert)."
    )


def replace_custom_operators(document: dict, where: str) -> list[str]:
    """Rewrite the top graph's calls of library operators into the stand-in, in place; the operators' names, in order.

    Raises:
        InputFileError: a call with several outputs or an output of symbolic shape (no stand-in holds it), named.
    """
    graph = document.get("graph_module", {}).get("graph", {}) if isinstance(document, dict) else {}
    nodes, values = graph.get("nodes"), graph.get("tensor_values")
    if not isinstance(nodes, list) or not isinstance(values, dict):
        return []
    found = []
    for node in nodes:
        operator = custom_operator(node.get("target")) if isinstance(node, dict) else None
        if operator is None:
            continue
        outputs = node.get("outputs")
        single = isinstance(outputs, list) and len(outputs) == 1 and isinstance(outputs[0], dict)
        single = single and "as_tensor" in outputs[0]
        if not single:
            raise refusal(operator, where, "its call has several outputs, which no stand-in holds")
        meta = values.get(outputs[0]["as_tensor"].get("name"))
        sizes = _static(meta.get("sizes")) if isinstance(meta, dict) else None
        strides = _static(meta.get("strides")) if isinstance(meta, dict) else None
        if sizes is None or strides is None or not isinstance(meta.get("dtype"), int):
            raise refusal(operator, where, "its output's shape is symbolic, which no stand-in holds")
        tensors = [a["arg"] for a in node.get("inputs", []) if isinstance(a, dict) and isinstance(a.get("arg"), dict)]
        inputs = [t["as_tensor"] for t in tensors if "as_tensor" in t]
        inputs += [x for t in tensors if isinstance(t.get("as_tensors"), list) for x in t["as_tensors"]]
        node["target"] = TARGET
        node["inputs"] = [
            {"name": "inputs", "arg": {"as_tensors": inputs}, "kind": 1},
            {"name": "operator", "arg": {"as_string": operator}, "kind": 1},
            {"name": "size", "arg": {"as_ints": sizes}, "kind": 1},
            {"name": "stride", "arg": {"as_ints": strides}, "kind": 1},
            {"name": "dtype", "arg": {"as_scalar_type": meta["dtype"]}, "kind": 1},
        ]
        found.append(operator)
    if found:
        register()
    return found


def _static(values: Any) -> list[int] | None:
    if not isinstance(values, list) or not all(isinstance(v, dict) and type(v.get("as_int")) is int for v in values):
        return None
    return [v["as_int"] for v in values]


class OpaqueOperatorError(RuntimeError):
    """A program holding a stand-in was run."""


@functools.cache
def register() -> Any:
    """Define `normbridge::opaque_operator` (once per process): its fake tensor has the recorded shape; running it
    raises."""
    import torch

    schema = "(Tensor[] inputs, str operator, int[] size, int[] stride, ScalarType dtype) -> Tensor"

    @torch.library.custom_op("normbridge::opaque_operator", mutates_args=(), schema=schema)
    def opaque_operator(inputs, operator, size, stride, dtype):
        raise OpaqueOperatorError(
            f"this program calls {operator}, a library's own operator normbridge read but does not run (loading it "
            "could run code): it can be inspected and registered (--allow-unrecognised), not run; run it where the "
            "library is installed, from code you trust, or export the model's `save_pretrained` folder instead "
            "(`normbridge export DIR --to onnx`)."
        )

    @opaque_operator.register_fake
    def _(inputs, operator, size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype)

    return opaque_operator


def is_opaque(node: Any) -> bool:
    """True for a graph node calling the stand-in."""
    return getattr(node, "op", None) == "call_function" and str(getattr(node, "target", "")) == _LOADED_NAME


def operator_of(node: Any) -> str:
    """The library operator a stand-in node stands for."""
    return str(node.args[1]) if len(node.args) > 1 else str(node.kwargs.get("operator", "?"))


__all__ = ["TARGET", "custom_operator", "is_opaque", "operator_of", "register", "replace_custom_operators"]
