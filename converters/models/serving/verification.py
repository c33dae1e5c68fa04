"""Verification of an exported graph against its source: every normalization site's settings,
paired with its source layer.

Used by the serving export (every site checked before the file is written) and by the contract
(to name the layer and the setting behind an output that differs). Sites are paired with source
layers by name where names tell, in order otherwise; eps is compared as float32 (ONNX attributes
are float32) and reported as the shortest decimal that rounds to it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from schemas import NormSpec
from schemas.floats import recover_from_float32
from schemas.kinds import KIND_INFO
from schemas.serving import SiteVerification

from ...adapters import REGISTRY
from .samples import Sample

STATE_SETTINGS = ("running_mean", "running_var", "scale", "bias")


# --------------------------------------------------------------------------- source specs


def source_specs(model: Any, sample: Sample | None = None) -> list[NormSpec]:
    """The normalization specs of a torch module (execution order on `sample`), ExportedProgram
    (graph order) or Keras model (layer order)."""
    return REGISTRY.model_adapter_of(model).layer_specs(model, sample)


# --------------------------------------------------------------------------- verification


def _part_fits(site_part: str, layer_part: str, exact: bool) -> bool:
    """One scope of a graph site's name against one part of a layer's path: equal, or (`exact` False) that part with
    the '_N' TF adds to a scope name already taken (each retrace scopes every nested layer again: 'block_0_1')."""
    if site_part == layer_part:
        return True
    return not exact and re.fullmatch(re.escape(layer_part) + r"_\d+", site_part) is not None


def _names_match(site_name: str, layer_name: str, exact: bool) -> bool:
    """Whether a graph site's name refers to a source layer: equal, or its '/'-separated parts (a Keras layer's path
    inside the model, 'transformer_layer_0/feedforward_layernorm') equal to consecutive scopes of the site's name, each
    part allowed TF's '_N' suffix when `exact` is False (tf2onnx scopes that layer
    'backbone_1/transformer_layer_0_1/feedforward_layernorm_1'). With `exact` False at least one part carries the
    suffix, so an exact fit is never counted twice."""
    if site_name == layer_name:
        return True
    scopes = re.split(r"[/:]", site_name)
    parts = layer_name.split("/")
    for start in range(len(scopes) - len(parts) + 1):
        window = scopes[start : start + len(parts)]
        if all(_part_fits(s, p, exact) for s, p in zip(window, parts)) and (exact or window != parts):
            return True
    return False


def served_kind(spec: NormSpec) -> str:
    """The kind of the node a layer is served as: an InstanceNorm in eval that tracks running statistics normalizes each
    channel with them, which is a BatchNormalization (torch.onnx writes it as one); every other layer, its own kind."""
    if spec.kind == "instance" and spec.track_running_stats and not spec.training:
        return "batch"
    return spec.kind


def _pair(
    specs: list[NormSpec], sites: list, unused: frozenset[str] = frozenset()
) -> list[tuple[NormSpec | None, Any | None]]:
    """Source specs and graph sites paired per served kind: by name where names tell, the rest in order when their
    counts agree (without the `unused` layers, dead code the exporter drops, when only that makes them agree)."""
    pairs: list[tuple[NormSpec | None, Any | None]] = []
    for kind in dict.fromkeys([served_kind(s) for s in specs] + [site.kind for site in sites]):
        wanted = [s for s in specs if served_kind(s) == kind]
        found = [site for site in sites if site.kind == kind]
        paired: dict[int, int] = {}
        # A site whose name fits one unpaired layer only is that layer's, first: tf2onnx scopes layers 'x' and 'x_1' as
        # 'x_1' and 'x_1_2', so 'x_1' alone does not tell (an exact match would take it for layer 'x_1').
        fits = {
            (i, j)
            for i, spec in enumerate(wanted)
            for j, site in enumerate(found)
            if _names_match(site.name, spec.name, True) or _names_match(site.name, spec.name, False)
        }
        progress = True
        while progress:
            progress = False
            for j in range(len(found)):
                candidates = [i for i in range(len(wanted)) if i not in paired and (i, j) in fits]
                if j not in paired.values() and len(candidates) == 1:
                    paired[candidates[0]] = j
                    progress = True
        for exact in (True, False):
            for i, spec in enumerate(wanted):
                if i in paired:
                    continue
                j = next(
                    (
                        j
                        for j, site in enumerate(found)
                        if j not in paired.values() and _names_match(site.name, spec.name, exact)
                    ),
                    None,
                )
                if j is not None:
                    paired[i] = j
        rest_specs = [i for i in range(len(wanted)) if i not in paired]
        rest_sites = [j for j in range(len(found)) if j not in paired.values()]
        live = [i for i in rest_specs if wanted[i].name not in unused]
        if len(rest_specs) == len(rest_sites) or len(live) == len(rest_sites):
            matched = rest_specs if len(rest_specs) == len(rest_sites) else live
            paired.update(zip(matched, rest_sites))
            rest_specs, rest_sites = [i for i in rest_specs if i not in matched], []
        order = sorted(paired, key=lambda i: paired[i])
        pairs += [(wanted[i], found[paired[i]]) for i in order]
        pairs += [(wanted[i], None) for i in rest_specs] + [(None, found[j]) for j in rest_sites]
    return pairs


def _entry(
    site: str, spec: NormSpec | None, kind: str, setting: str, expected: str, found: str, passed: bool, note: str = ""
) -> SiteVerification:
    return SiteVerification(
        site=site,
        source_layer=None if spec is None else spec.name,
        kind=kind,
        setting=setting,
        expected=expected,
        found=found,
        passed=passed,
        note=note,
    )


def expected_tensor(spec: NormSpec, setting: str) -> np.ndarray | None:
    """The tensor an exported graph holds for `setting`: for a scale offset (Gemma's `1.0 + weight.float()`), the
    factor, computed in float32 as the source computes it."""
    tensor = spec.tensors.get(setting)
    if setting != "scale" or tensor is None or not spec.scale_offset:
        return tensor
    return (tensor.astype(np.float32) + np.float32(spec.scale_offset)).astype(np.float32)


#: What a layer absent from the graph is told when its output reaches no output of the source (`unused`).
UNUSED_NOTE = "not checked: its output reaches no output of the source model (dead code), so the exporter dropped it and it cannot change what the file serves"


def verify_sites(
    specs: list[NormSpec],
    sites: list,
    missing_note: str = "the exporter removed or fused it beyond recognition",
    unused: frozenset[str] = frozenset(),
) -> list[SiteVerification]:
    """Every normalization site of the exported graph against its source layer: presence, eps, state tensors, mode.

    A layer named in `unused` (its output reaches no model output) that is absent from the graph passes presence,
    noted as not checked."""
    entries: list[SiteVerification] = []
    for spec, site in _pair(specs, sites, unused):
        if site is None and spec.name in unused:
            entries.append(
                _entry(
                    "(not exported: dead code, not checked)",
                    spec,
                    spec.kind,
                    "presence",
                    f"a {spec.kind} normalization",
                    "none in the exported graph (not checked)",
                    True,
                    UNUSED_NOTE,
                )
            )
            continue
        if site is None:
            entries.append(
                _entry(
                    "(missing)",
                    spec,
                    spec.kind,
                    "presence",
                    f"a {spec.kind} normalization",
                    "none in the exported graph",
                    False,
                    missing_note,
                )
            )
            continue
        if spec is None:
            entries.append(
                _entry(
                    site.name,
                    None,
                    site.kind,
                    "presence",
                    "no such layer in the source",
                    f"{'+'.join(site.op_types)}",
                    False,
                    "the graph holds a normalization the source does not",
                )
            )
            continue
        label = site.name
        if site.folded or site.eps is None:
            entries.append(
                _entry(
                    label,
                    spec,
                    spec.kind,
                    "eps",
                    repr(spec.eps),
                    "unreadable (folded into constants)",
                    False,
                    "the exporter folded this BatchNorm; export with rewrite on to restore the native op",
                )
            )
        else:
            recovered = recover_from_float32(site.eps, hint=spec.eps)
            ok = bool(np.float32(site.eps) == np.float32(spec.eps))
            entries.append(
                _entry(
                    label,
                    spec,
                    spec.kind,
                    "eps",
                    repr(spec.eps),
                    repr(recovered),
                    ok,
                    "" if ok else "eps differs from the source layer's",
                )
            )
        exported = site.spec.tensors if site.spec is not None else {}
        for setting in STATE_SETTINGS:
            expected = expected_tensor(spec, setting)
            if expected is None:
                continue
            got = exported.get(setting)
            if got is None:
                if setting in (
                    "scale",
                    "bias",
                ):  # weights a decomposition may apply outside the matched nodes: the contract covers them
                    continue
                entries.append(
                    _entry(
                        label,
                        spec,
                        spec.kind,
                        setting,
                        f"float32[{expected.size}]",
                        "not readable from the graph",
                        False,
                    )
                )
                continue
            if (
                served_kind(spec) != spec.kind
                and got.ndim == expected.ndim == 1
                and got.size > expected.size
                and got.size % expected.size == 0
            ):
                # torch.onnx's eval InstanceNorm: a BatchNormalization over the (1, N*C, ...) view,
                # its state repeated for each of N requests
                expected = np.tile(expected, got.size // expected.size)
            same = got.shape == expected.shape and np.array_equal(got.astype(np.float32), expected.astype(np.float32))
            note = (
                ""
                if same
                else f"max |difference| {float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64)))):.3e}"
                if got.shape == expected.shape
                else "shape differs"
            )
            entries.append(
                _entry(
                    label,
                    spec,
                    spec.kind,
                    setting,
                    f"float32[{expected.size}]",
                    "equal as float32" if same else "different",
                    same,
                    note,
                )
            )
        if (
            KIND_INFO[spec.kind].running_stats and spec.track_running_stats
        ):  # the layers whose output depends on the mode
            if spec.training:
                entries.append(
                    _entry(
                        label,
                        spec,
                        spec.kind,
                        "mode",
                        "eval (serving)",
                        "source layer in train mode",
                        False,
                        "call .eval() on the model before exporting; torch.onnx silently serves running statistics for it",
                    )
                )
            else:
                entries.append(
                    _entry(
                        label,
                        spec,
                        spec.kind,
                        "mode",
                        "eval",
                        "training_mode=1" if site.training_mode else "eval",
                        not site.training_mode,
                        "batch statistics in the serving graph" if site.training_mode else "",
                    )
                )
    return entries


__all__ = ["STATE_SETTINGS", "UNUSED_NOTE", "served_kind", "source_specs", "verify_sites"]
