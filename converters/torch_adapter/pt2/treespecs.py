"""The input and output structures of a `.pt2` program, made readable without importing the library that wrote them.

`torch.export.save` records a program's output structure by the Python type's name: a transformers model
returns `transformers.modeling_outputs.BaseModelOutputWithPast`, registered as a pytree node by transformers
when it is imported. Reading the file in a process that has not imported transformers fails ("Deserializing
... in pytree is not registered"), and importing a module the file names would run code chosen by the file.
So a node of a type this process has not registered, whose context is the list of its field names (what
transformers' ModelOutput and any dataclass-like output record), is read as a dict with the same keys in the
same order: the same tensors, in the same flat order, under the same names. Anything else is left for
torch's deserializer to refuse. Should this torch not say which types it registered (torch_internals), nothing is
rewritten: torch's deserializer then refuses a type it does not know rather than this guessing.
"""

from __future__ import annotations

import json
from typing import Any

from ..torch_internals import registered_pytree_types

#: Where torch.export's document keeps the structures of the program's signature.
SPEC_FIELDS = ("in_spec", "out_spec")
#: The serialized name of the node type that stands in for an unregistered one.
DICT = "builtins.dict"


def read_as_dicts(document: dict) -> list[str]:
    """Rewrite, in place, every unregistered structure type of the document's call signatures as a dict;
    the types rewritten."""
    known = registered_pytree_types()
    rewritten: list[str] = []
    if known is None:
        return rewritten
    graph_module = document.get("graph_module")
    calls = graph_module.get("module_call_graph") if isinstance(graph_module, dict) else None
    for entry in calls if isinstance(calls, list) else ():  # anything else is torch's deserializer's to refuse
        signature = entry.get("signature") if isinstance(entry, dict) else None
        for field in SPEC_FIELDS if isinstance(signature, dict) else ():
            text = signature.get(field)
            if not isinstance(text, str):
                continue
            try:
                spec = json.loads(text)
            except ValueError:
                continue  # torch's deserializer says what is wrong with it
            if _rewrite(spec, known, rewritten):
                signature[field] = json.dumps(spec)
    return sorted(set(rewritten))


def _rewrite(node: Any, known: frozenset[str], rewritten: list[str]) -> bool:
    """Replace unregistered field-list nodes below `node` (a [protocol, tree] pair or a tree node);
    whether anything changed."""
    if isinstance(node, list):
        return any([_rewrite(child, known, rewritten) for child in node])
    if not isinstance(node, dict):
        return False
    changed = False
    kind = node.get("type")
    if isinstance(kind, str) and kind not in known and _field_names(node.get("context")):
        rewritten.append(kind)
        node["type"] = DICT
        changed = True
    return _rewrite(node.get("children_spec"), known, rewritten) or changed


def _field_names(context: Any) -> bool:
    """Whether a node's serialized context is a JSON list of field names (what a dict's context is)."""
    try:
        names = json.loads(context) if isinstance(context, str) else None
    except ValueError:
        return False
    return isinstance(names, list) and all(isinstance(n, str) for n in names)


__all__ = ["read_as_dicts"]
