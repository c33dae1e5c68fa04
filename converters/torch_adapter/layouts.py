"""The channel layout a layer was built with where its framework offers both (spec.chosen_layout): a PyTorch module
is always channels-first, so it only keeps the choice, on the in-memory module, for a conversion back
(keras_adapter/layouts.py)."""

from __future__ import annotations

from typing import Any

import torch

from schemas import LayerReport, NormSpec

from .. import markers

STORED = (
    "kept on the in-memory module only (normbridge marker), for a conversion back to a framework that offers "
    "both layouts"
)


def remember_layout(module: torch.nn.Module, spec: NormSpec, report: LayerReport) -> None:
    if spec.chosen_layout is not None:
        markers.remember(module, chosen_layout=spec.chosen_layout)
        report.add("chosen_layout", spec.chosen_layout, spec.chosen_layout, "stored", STORED)


def remembered_layout(remembered: dict[str, Any]) -> str | None:
    value = remembered.get("chosen_layout")
    return value if value in ("channels_first", "channels_last") else None
