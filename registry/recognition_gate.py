"""What a registration does with normalization it cannot check: refuse it, or hold it unchecked by request;
never pass it.

A model can hold layers that look like normalizations and that no recognizer proved (a hand-rolled
class, a spelling normbridge does not read). The equivalence gate checks only what was recognised, so
"every check passed" would be false for the rest. Such a model is refused unless the user asks for it
(`register --allow-unrecognised`); the layers are then kept in the manifest (`unrecognised`) and named
in the audit entry, so nobody reads the version as checked. A model with weights in which nothing was
recognised at all is refused the same way: "0/0 passed" is not a pass.
"""

from __future__ import annotations

from schemas.errors import UnrecognisedNormalizationError
from schemas.inspection import Hazard
from schemas.manifest import ArtifactManifest, UnrecognisedLayer

#: The hazard code of a layer that looks like a normalization and that no recognizer proved.
UNRECOGNISED = "unrecognised_normalization"
#: The manifest entry standing for a model in which no normalization was found at all.
WHOLE_MODEL = "<model>"
#: Model hazards that say why a model holds no normalization layer: the refusal quotes them (an ONNX graph whose
#: BatchNorms an exporter folded into the Conv weights has none left to check, and the user needs to know how to keep
#: them).
EXPLAINS_NONE = ("folded_batchnorm",)


def unrecognised_layers(hazards: list[Hazard]) -> list[UnrecognisedLayer]:
    """The manifest entries for the unrecognised_normalization hazards of a model adapter (the adapters name the class
    at the head of the message, before " looks like")."""
    return [
        UnrecognisedLayer(
            path=h.layer or WHOLE_MODEL, type=h.message.split(" looks like", 1)[0][:200], reason=h.message
        )
        for h in hazards
        if h.code == UNRECOGNISED
    ]


def nothing_found(framework: str, tensors: int, hazards: list[Hazard] = ()) -> UnrecognisedLayer:
    """The entry for a model with `tensors` tensors and no normalization layer, with what its hazards say about why."""
    why = "".join(f"; {h.message.rstrip('.')}" for h in hazards if h.code in EXPLAINS_NONE)
    return UnrecognisedLayer(
        path=WHOLE_MODEL,
        type=framework,
        reason=f"no normalization layer was found among the model's {tensors} tensors, so the equivalence check "
        f"would check nothing{why}",
    )


def unchecked(manifest: ArtifactManifest) -> list[UnrecognisedLayer]:
    """What the gate cannot check in `manifest`: its unrecognised layers, or the whole model when it lists no normalizer
    but holds tensors."""
    if manifest.unrecognised:
        return list(manifest.unrecognised)
    if not manifest.normalizers and manifest.tensors:
        return [nothing_found(manifest.framework, len(manifest.tensors))]
    return []


def admit(manifest: ArtifactManifest, allow_unrecognised: bool) -> ArtifactManifest:
    """`manifest`, holding every unchecked layer, when it has none or they are allowed;
    UnrecognisedNormalizationError otherwise."""
    found = unchecked(manifest)
    if not found or allow_unrecognised:
        return manifest.model_copy(update={"unrecognised": found})
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    raise UnrecognisedNormalizationError(
        f"{first.reason.rstrip('.')}{more}. Nothing was registered, since the equivalence check cannot cover it: declare the class with "
        "converters.recognize(...) (docs/recognition.md), or register with --allow-unrecognised to keep it recorded as unchecked.",
        layer=None if first.path == WHOLE_MODEL else first.path,
    )


__all__ = ["EXPLAINS_NONE", "UNRECOGNISED", "WHOLE_MODEL", "admit", "nothing_found", "unchecked", "unrecognised_layers"]
