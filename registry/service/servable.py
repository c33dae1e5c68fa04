"""Whether a version may serve: its hazards, the verdict they give, and the guard on aliases such as production.

The equivalence gate proves that every normalization converts faithfully; it says nothing about
whether the model is fit to serve. A `.pt2` exported in train mode converts faithfully and still
normalises each request with its batch's statistics; BatchNorms that never saw data pass every
check and serve nonsense. So registration records the warning- and error-level hazards `inspect`
would report on the stored layers, and a verdict: not servable when any hazard blocks (BLOCKING).

The verdict is computed from what the registry stores (the manifest and the normalizers' tensors),
never from the uploaded file, so a version gets the same verdict however it arrived (a file, a
bundle over HTTP, an artifact folder), and a version registered before the verdict existed is
assessed the same way when it is read. Moving a guarded alias (settings.guarded_aliases:
production by default) to a version that is not servable is refused with the reasons, unless
forced; a forced move names what it overrode in its audit entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from converters.adapters import REGISTRY
from converters.model_values import LayerFacts
from converters.models.hazards import layer_hazards
from schemas import NormSpec
from schemas.errors import NotServableError
from schemas.inspection import Hazard
from schemas.manifest import ArtifactManifest

from ..recognition_gate import WHOLE_MODEL

#: Severities a version records (info-level ones, such as an unusual eps, stay in `inspect`).
RECORDED = ("warning", "error")
#: Warning-level hazards that block serving as errors do: statistics that never saw data, an eps that rounds to 0 in the
#: layer's compute dtype (eps_underflow is a warning only then; a subnormal eps is info), and layers the equivalence
#: check could not cover. Other warnings (momentum=None, a folded BatchNorm, unconverged statistics, whose batch counter
#: is history rather than a measurement) are recorded, not blocking.
BLOCKING_WARNINGS = frozenset(
    {"never_trained", "eps_underflow", "unrecognised_normalization", "no_normalization_found"}
)
#: Hazards a version's lineage answers, by its operation: a `recalibrated` version's statistics are the population
#: statistics of its recalibration data (`normbridge recalibrate --register`), which keep none of the initial values
#: whatever its batch counter says, so it is not called unconverged.
ANSWERED_BY_LINEAGE = {"recalibrated": frozenset({"unconverged_statistics"})}
#: Where a stored layer was read from, by the manifest's format (the hazards word their fix by it):
#: each FrameworkInfo's.
ORIGINS = {fmt: origin for info in REGISTRY.infos() for fmt, origin in info.format_origins.items()}
#: The origin of an imported artifact folder's layers, by framework.
FRAMEWORK_ORIGINS = {info.name: info.object_origin for info in REGISTRY.infos()}


class VersionHazard(BaseModel):
    """One hazard of a version, as stored with it and sent by `show --json` and the API."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    layer: str | None = Field(default=None, description="The layer's path, or null for the model as a whole.")
    code: str = Field(
        description="Stable name, e.g. train_mode, never_trained, eps_underflow, unrecognised_normalization."
    )
    severity: str = Field(description="error or warning.")
    message: str
    blocking: bool = Field(description="Whether this hazard makes the version not servable.")


def blocks(hazard: Hazard) -> bool:
    """Whether a hazard makes a version not servable: every error, and the warnings in BLOCKING_WARNINGS."""
    return hazard.severity == "error" or (hazard.severity == "warning" and hazard.code in BLOCKING_WARNINGS)


@dataclass(frozen=True)
class Verdict:
    """Servable or not, and every recorded hazard (the blocking ones are the reasons)."""

    servable: bool
    hazards: list[VersionHazard] = field(default_factory=list)

    def stored(self) -> tuple[bool, list[dict]]:
        """(servable, hazards as JSON): what the metadata store keeps with the version."""
        return self.servable, [h.model_dump(mode="json") for h in self.hazards]


def stored_layer_facts(manifest: ArtifactManifest, path: str, spec: NormSpec) -> LayerFacts:
    """What the hazards read of a stored layer; its origin comes from the manifest's format, so a `.pt2`'s layers are
    worded as exported ops ("exported in train mode"), not as live modules."""
    origin = ORIGINS.get(manifest.format) or FRAMEWORK_ORIGINS.get(manifest.framework, "module")
    return LayerFacts(
        path=path,
        kind=spec.kind,
        framework=manifest.framework,
        origin=origin,
        layer_type=spec.source.layer_type or spec.kind,
        spec=spec,
        training=spec.training,
    )


def stored_layer_hazards(manifest: ArtifactManifest, path: str, spec: NormSpec) -> list[Hazard]:
    """Every hazard of a stored layer (all severities), less those the version's lineage answers
    (ANSWERED_BY_LINEAGE)."""
    answered = ANSWERED_BY_LINEAGE.get(manifest.lineage.operation, frozenset())
    return [h for h in layer_hazards(stored_layer_facts(manifest, path, spec)) if h.code not in answered]


def _unchecked(manifest: ArtifactManifest) -> list[tuple[str | None, Hazard]]:
    """The layers registered unchecked (--allow-unrecognised) as hazards: the equivalence check did not cover them."""
    found = []
    for entry in manifest.unrecognised:
        if entry.path == WHOLE_MODEL:
            found.append((None, Hazard(code="no_normalization_found", severity="warning", message=entry.reason)))
        else:
            found.append(
                (entry.path, Hazard(code="unrecognised_normalization", severity="error", message=entry.reason))
            )
    return found


def assess(manifest: ArtifactManifest, specs: Iterable[NormSpec]) -> Verdict:
    """The verdict of a version from its manifest and its normalizers' specs (one per manifest normalizer, in order)."""
    found = _unchecked(manifest)
    for entry, spec in zip(manifest.normalizers, specs):
        found += [(entry.path, h) for h in stored_layer_hazards(manifest, entry.path, spec)]
    hazards = [
        VersionHazard(layer=where, code=h.code, severity=h.severity, message=h.message, blocking=blocks(h))
        for where, h in found
        if h.severity in RECORDED
    ]
    return Verdict(servable=not any(h.blocking for h in hazards), hazards=hazards)


def unassessable(reason: str) -> Verdict:
    """The verdict of a version whose stored state could not be read: not servable, saying why."""
    return Verdict(
        servable=False,
        hazards=[
            VersionHazard(
                code="unassessable",
                severity="error",
                blocking=True,
                message=(
                    f"the version's stored state could not be read to assess it ({reason}); run `normbridge verify` on it."
                ),
            )
        ],
    )


def reasons(hazards: Iterable[dict]) -> list[str]:
    """'code at layer: message' for each blocking hazard of a stored version."""
    return [
        f"{h['code']}{' at ' + h['layer'] if h.get('layer') else ''}: {h['message']}"
        for h in hazards
        if h.get("blocking")
    ]


def guard_alias(alias: str, record, guarded: frozenset[str], force: bool) -> dict | None:
    """None when `alias` may point at `record` as any alias may; the audit detail of a forced move of a guarded alias
    to a version that is not servable; NotServableError when that move was not forced."""
    if alias not in guarded or record.servable:
        return None
    why = reasons(record.hazards)
    if not force:
        more = f" (and {len(why) - 1} more)" if len(why) > 1 else ""
        raise NotServableError(
            f"alias '{record.model}@{alias}' is guarded and {record.ref} is not servable: {why[0].rstrip('.') if why else 'no verdict'}{more}; "
            f"nothing was moved. Register a version without these hazards (`normbridge show {record.ref}` lists them), or move the "
            "alias anyway with `normbridge alias --force` (HTTP: ?force=true), which the audit log records. The guarded aliases "
            "are set by `normbridge serve --guarded-alias` or NORMBRIDGE_GUARDED_ALIASES."
        )
    return {"forced": True, "not_servable": sorted({h["code"] for h in record.hazards if h.get("blocking")})}


__all__ = [
    "ANSWERED_BY_LINEAGE",
    "BLOCKING_WARNINGS",
    "RECORDED",
    "Verdict",
    "VersionHazard",
    "assess",
    "blocks",
    "guard_alias",
    "reasons",
    "stored_layer_facts",
    "stored_layer_hazards",
    "unassessable",
]
