"""How the CLI prints hazards: one line per distinct hazard with its layers (schemas/hazard_groups.py),
not per layer."""

from __future__ import annotations

from schemas.hazard_groups import HazardGroup

from .fitting import say_marked


def say_hazard_groups(groups: list[HazardGroup], mark_blocking: bool = False, indent: str = "") -> None:
    """'warning never_trained at bn1, bn2, bn3 and 56 more: message', coloured by severity; BLOCKS marks a blocking
    one."""
    from schemas.inspection import severity_style

    for group in groups:
        blocks = "BLOCKS " if mark_blocking and group.blocking else ""
        count = f" ({len(group.layers)} layers)" if len(group.layers) > 1 else ""
        say_marked(
            f"{indent}{blocks}[{severity_style(group.severity)}]{group.severity}[/] {group.code}",
            f" at {group.layers_text()}{count}: {group.message}",
        )


__all__ = ["say_hazard_groups"]
