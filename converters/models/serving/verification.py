"""Verification of an exported graph against its source: every normalization site's settings, paired with its source layer.

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
    """The normalization specs of a torch module (execution order on `sample`), ExportedProgram (graph order) or Keras model (layer order)."""
    return REGISTRY.model_adapter_of(model).layer_specs(model, sample)


# --------------------------------------------------------------------------- verification


def _names_match(site_name: str, layer_name: str, exact: bool) -> bool:
    """Whether a graph site's name refers to a source layer: equal, or a '/'-separated part equal
    (tf2onnx scopes Keras layers as 'model_1/layer_1/...'; `exact` False also accepts that '_N' suffix)."""
    if site_name == layer_name:
        return True
    parts = re.split(r"[/:]", site_name)
    if exact:
        return layer_name in parts
    return any(re.fullmatch(re.escape(layer_name) + r"_\d+", part) for part in parts)


def _pair(specs: list[NormSpec], sites: list) -> list[tuple[NormSpec | None, Any | None]]:
    """Source specs and graph sites paired per kind: by name where names tell, the rest in order when their counts agree."""
    pairs: list[tuple[NormSpec | None, Any | None]] = []
    for kind in dict.fromkeys([s.kind for s in specs] + [site.kind for site in sites]):
        wanted = [s for s in specs if s.kind == kind]
        found = [site for site in sites if site.kind == kind]
        paired: dict[int, int] = {}
        for exact in (True, False):
            for i, spec in enumerate(wanted):
                if i in paired:
                    continue
                j = next((j for j, site in enumerate(found) if j not in paired.values() and _names_match(site.name, spec.name, exact)), None)
                if j is not None:
                    paired[i] = j
        rest_specs = [i for i in range(len(wanted)) if i not in paired]
        rest_sites = [j for j in range(len(found)) if j not in paired.values()]
        if len(rest_specs) == len(rest_sites):
            paired.update(zip(rest_specs, rest_sites))
            rest_specs, rest_sites = [], []
        order = sorted(paired, key=lambda i: paired[i])
        pairs += [(wanted[i], found[paired[i]]) for i in order]
        pairs += [(wanted[i], None) for i in rest_specs] + [(None, found[j]) for j in rest_sites]
    return pairs


def _entry(site: str, spec: NormSpec | None, kind: str, setting: str, expected: str, found: str, passed: bool, note: str = "") -> SiteVerification:
    return SiteVerification(site=site, source_layer=None if spec is None else spec.name, kind=kind, setting=setting,
                            expected=expected, found=found, passed=passed, note=note)


def expected_tensor(spec: NormSpec, setting: str) -> np.ndarray | None:
    """The tensor an exported graph holds for `setting`: for a scale offset (Gemma's `1.0 + weight.float()`), the factor,
    computed in float32 as the source computes it."""
    tensor = spec.tensors.get(setting)
    if setting != "scale" or tensor is None or not spec.scale_offset:
        return tensor
    return (tensor.astype(np.float32) + np.float32(spec.scale_offset)).astype(np.float32)


def verify_sites(specs: list[NormSpec], sites: list, missing_note: str = "the exporter removed or fused it beyond recognition") -> list[SiteVerification]:
    """Every normalization site of the exported graph against its source layer: presence, eps, state tensors, mode."""
    entries: list[SiteVerification] = []
    for spec, site in _pair(specs, sites):
        if site is None:
            entries.append(_entry("(missing)", spec, spec.kind, "presence", f"a {spec.kind} normalization", "none in the exported graph", False,
                                  missing_note))
            continue
        if spec is None:
            entries.append(_entry(site.name, None, site.kind, "presence", "no such layer in the source", f"{'+'.join(site.op_types)}", False,
                                  "the graph holds a normalization the source does not"))
            continue
        label = site.name
        if site.folded or site.eps is None:
            entries.append(_entry(label, spec, spec.kind, "eps", repr(spec.eps), "unreadable (folded into constants)", False,
                                  "the exporter folded this BatchNorm; export with rewrite on to restore the native op"))
        else:
            recovered = recover_from_float32(site.eps, hint=spec.eps)
            ok = bool(np.float32(site.eps) == np.float32(spec.eps))
            entries.append(_entry(label, spec, spec.kind, "eps", repr(spec.eps), repr(recovered), ok, "" if ok else "eps differs from the source layer's"))
        exported = site.spec.tensors if site.spec is not None else {}
        for setting in STATE_SETTINGS:
            expected = expected_tensor(spec, setting)
            if expected is None:
                continue
            got = exported.get(setting)
            if got is None:
                if setting in ("scale", "bias"):  # weights a decomposition may apply outside the matched nodes: the contract covers them
                    continue
                entries.append(_entry(label, spec, spec.kind, setting, f"float32[{expected.size}]", "not readable from the graph", False))
                continue
            same = got.shape == expected.shape and np.array_equal(got.astype(np.float32), expected.astype(np.float32))
            note = "" if same else f"max |difference| {float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64)))):.3e}" if got.shape == expected.shape else "shape differs"
            entries.append(_entry(label, spec, spec.kind, setting, f"float32[{expected.size}]", "equal as float32" if same else "different", same, note))
        if KIND_INFO[spec.kind].running_stats and spec.track_running_stats:  # the layers whose output depends on the mode
            if spec.training:
                entries.append(_entry(label, spec, spec.kind, "mode", "eval (serving)", "source layer in train mode", False,
                                      "call .eval() on the model before exporting; torch.onnx silently serves running statistics for it"))
            else:
                entries.append(_entry(label, spec, spec.kind, "mode", "eval", "training_mode=1" if site.training_mode else "eval", not site.training_mode,
                                      "batch statistics in the serving graph" if site.training_mode else ""))
    return entries


__all__ = ["STATE_SETTINGS", "source_specs", "verify_sites"]
