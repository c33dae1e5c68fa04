"""How the CLI words a version's servable verdict (registry/service/servable.py): in `register`,
`versions` and `show`."""

from __future__ import annotations

from schemas.hazard_groups import elided_layers, group_hazard_dicts

from .fitting import say_marked
from .hazard_text import say_hazard_groups


def blocking_text(record) -> str:
    """'train_mode at bn1, bn2; never_trained at bn3': the hazards that make a version not servable, by code (a long
    list of layers elided: 'bn1, bn2, bn3 and 56 more')."""
    layers: dict[str, list[str]] = {}
    for hazard in record.hazards:
        if hazard.get("blocking"):
            layers.setdefault(hazard["code"], []).append(hazard.get("layer") or "(model)")
    return "; ".join(f"{code} at {elided_layers(list(dict.fromkeys(where)))}" for code, where in layers.items())


def servable_cell(record) -> str:
    """The versions table's verdict: yes (with the codes of the recorded hazards that do not block, when there are any),
    or NO with the blocking hazards' codes."""
    if record.servable:
        warnings = list(dict.fromkeys(h["code"] for h in record.hazards if not h.get("blocking")))
        return f"yes (warns: {', '.join(warnings)})" if warnings else "yes"
    return "NO: " + ", ".join(dict.fromkeys(h["code"] for h in record.hazards if h.get("blocking")))


def say_registered_verdict(record) -> None:
    """After `register`: a line only when the new version may not serve."""
    if record.servable is False:
        say_marked(
            "  [bold red]not servable[/]: ",
            f"{blocking_text(record)} (`normbridge show {record.model}@{record.number}` says why; "
            "a guarded alias such as production refuses it without --force)",
        )


def say_verdict(record) -> None:
    """servable, or not servable with every blocking hazard; the other recorded hazards after it."""
    if record.servable:
        say_marked("[green]servable[/]: ", "no hazard blocks serving")
    else:
        say_marked("[bold red]not servable[/]: ", blocking_text(record))
    say_hazard_groups(group_hazard_dicts(record.hazards), mark_blocking=True, indent="  ")


__all__ = ["blocking_text", "say_registered_verdict", "say_verdict", "servable_cell"]
