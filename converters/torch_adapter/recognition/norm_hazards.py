"""Model hazards of torch models that no layer hazard can see: normalizations nobody proved, and SyncBatchNorm.

A module that looks like a normalization (a class name with "Norm", a 1-D weight and no children,
a stock subclass with its own forward) and that no recognizer proves is never skipped silently:
it is an `unrecognised_normalization` error naming its path and class, which `inspect`, `export`
and `register` report. A stock subclass whose forward does more than normalise (BatchNormAct2d)
is read as its stock class, and `computes_more` says what the conversion leaves out.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from schemas.inspection import Hazard

from ...recognizers import RECOGNIZERS
from ...recognizers.base import ObjectRecognizer
from .computed import recognition
from .exported_computed import program_modules
from ..pt2.opaque_operators import is_opaque, operator_of
from .traced_groups import module_paths

FIX = (
    "declare what it computes with converters.recognize(<class>, kind=..., eps=...), or register a recognizer "
    "(docs/contributing.md); until then its settings and state are unchecked"
)


def unrecognised(path: str, type_name: str, why: str, reason: str) -> Hazard:
    return Hazard(
        code="unrecognised_normalization",
        severity="error",
        layer=path,
        message=f"'{path}' ({type_name}) looks like a normalization ({why}) but no recognizer proved what it computes: "
        f"{reason}; {FIX}.",
    )


def _claimed_by_another(module: torch.nn.Module) -> bool:
    for recognizer in RECOGNIZERS.of("torch", ObjectRecognizer):
        if recognizer.name == "torch.computed":
            continue
        try:
            if recognizer.kind_of(module) is not None:
                return True
        except Exception:  # UnsupportedObjectError: a known class that cannot be converted, reported by its own path
            return True
    return False


def nothing_found(parameters: int) -> Hazard:
    return Hazard(
        code="no_normalization_found",
        severity="warning",
        message=(
            f"no normalization layer was found in a model with {parameters} parameter values: an equivalence check of its "
            "normalizations would check nothing, so it must not count as a pass; if the model has normalizations, they are "
            "spelled in a way no recognizer reads (docs/recognition.md)."
        ),
    )


def module_hazards(model: torch.nn.Module, found_count: int | None = None) -> list[Hazard]:
    """Hazards of a live module tree; `found_count` is how many normalization layers inspection listed."""
    hazards = []
    for path, module in model.named_modules():
        path = path or type(module).__name__
        if isinstance(module, torch.nn.SyncBatchNorm):
            hazards.append(sync_batchnorm(path))
        found = recognition(module)
        if found is None:
            continue
        if found.spec is not None:
            hazards += _takes_more_than_its_input(path, module, found.spec.kind)
            continue
        if _claimed_by_another(module):
            hazards.append(
                Hazard(
                    code="computes_more",
                    severity="warning",
                    message=(
                        f"'{path}' ({type(module).__name__}) is read as its stock normalization class, but its forward is not only that: "
                        f"{found.reason}; a converted layer holds the normalization alone."
                    ),
                )
            )
        else:
            hazards.append(unrecognised(path, type(module).__name__, found.why_candidate, found.reason))
    return hazards + _empty(hazards, found_count, sum(p.numel() for p in model.parameters()))


def _takes_more_than_its_input(path: str, module: torch.nn.Module, kind: str) -> list[Hazard]:
    """computes_more for a proved module whose forward takes other inputs (transformers' MambaRMSNormGated(x, gate)
    normalizes x * silu(gate)): the proof called it with its input alone, and a live module does not say how the model
    calls it (a .pt2 does: there the gated call is not proved, and is unrecognised)."""
    try:
        parameters = list(inspect.signature(type(module).forward).parameters.values())[2:]  # after self and the input
    except (TypeError, ValueError):
        return []
    others = [p.name for p in parameters if p.kind is not p.VAR_KEYWORD]
    if not others:
        return []
    return [
        Hazard(
            code="computes_more",
            severity="warning",
            layer=path,
            message=(
                f"'{path}' ({type(module).__name__}) was proved to be a {kind} normalization when called with its input alone, but its "
                f"forward also takes {', '.join(others)}: a call that passes {'it' if len(others) == 1 else 'them'} computes more than "
                "the normalization, and a converted layer holds the normalization alone (a .pt2 of the model shows how it is called)."
            ),
        )
    ]


def _empty(hazards: list[Hazard], found: int | None, parameters: int) -> list[Hazard]:
    """no_normalization_found when inspection listed nothing, nothing unrecognised was named,
    and the model has parameters."""
    if found == 0 and parameters > 0 and not any(h.code == "unrecognised_normalization" for h in hazards):
        return [nothing_found(parameters)]
    return []


def program_hazards(program: Any, found: int | None = None) -> list[Hazard]:
    """Hazards of a .pt2 program's modules; `found` is how many normalization layers inspection listed."""
    synced = {
        path for node in program.graph.nodes for path, type_name in module_paths(node) if type_name == "SyncBatchNorm"
    }
    hazards = [sync_batchnorm(path) for path in sorted(synced)] + opaque_calls(program)
    for module in program_modules(program):
        if module.spec is not None:
            continue
        if module.has_native_op:
            hazards.append(
                Hazard(
                    code="computes_more",
                    severity="warning",
                    message=(
                        f"'{module.path}' ({module.module_type}) calls a normalization op but computes more than it: {module.reason}; "
                        "only the op is read and converted."
                    ),
                )
            )
        else:
            hazards.append(unrecognised(module.path, module.module_type, module.why_candidate, module.reason))
    return hazards + _empty(hazards, found, sum(t.numel() for t in program.state_dict.values()))


def opaque_calls(program: Any) -> list[Hazard]:
    """unrecognised_normalization for each module calling a library's own operator, kept as a stand-in never run
    (pt2/opaque_operators.py): what it computes is unchecked, the program's normalizations outside it were read."""
    calls: dict[tuple[str, str], str] = {}
    for node in program.graph.nodes:
        if is_opaque(node):
            paths = module_paths(node)
            path, type_name = paths[-1] if paths else ("", "")
            calls.setdefault((path or type_name or "(model)", operator_of(node)), type_name)
    return [
        Hazard(
            code="unrecognised_normalization",
            severity="error",
            layer=path,
            message=(
                f"'{path}' ({type_name}) looks like it runs what normbridge cannot read: it calls {operator}, a library's own "
                "operator normbridge does not load (loading it could run code); the program's normalizations outside such "
                "calls were read and are checked: register with --allow-unrecognised to record this call as unchecked "
                "(re-exporting writes the same operator), or register the model's `save_pretrained` folder instead, which "
                "holds no program (docs/checkpoint-folders.md)."
            ),
        )
        for (path, operator), type_name in calls.items()
    ]


def sync_batchnorm(path: str) -> Hazard:
    return Hazard(
        code="per_device_statistics",
        severity="warning",
        message=(
            f"'{path}' is a SyncBatchNorm: at eval it computes what BatchNorm does (and is converted as one), but in training it "
            "averages batch statistics across the devices of its process group, which no converted layer does; a converted "
            "layer trained further uses per-device statistics."
        ),
    )


__all__ = ["module_hazards", "program_hazards", "unrecognised"]
