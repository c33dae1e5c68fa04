"""Which channel axis a Keras channel kind is built with, and what a Keras layer's axis says of the user's choice.

Keras offers both layouts (axis=-1, its natural one, and axis=1); PyTorch and ONNX fix channels_first. A spec records
the choice in `chosen_layout` (set only for axis=1: axis=-1 is no choice but Keras's default), the other frameworks
keep it, and converting back to Keras builds it again, so a BatchNormalization(axis=1) comes back with axis=1.
"""

from __future__ import annotations

from schemas import LayerReport, NormSpec

from ..translate import record_layout


def emit_layout(spec: NormSpec, report: LayerReport) -> tuple[int, str]:
    """(axis, layout) to build a channel kind with: the layout chosen where the layer came from, else channels_last."""
    layout = spec.chosen_layout or "channels_last"
    record_layout(report, spec, layout)
    axis = 1 if layout == "channels_first" else -1
    if spec.chosen_layout is not None:
        report.add(
            "chosen_layout",
            spec.chosen_layout,
            f"axis={axis}",
            "exact",
            "the layout the layer was built with where it came from",
        )
    return axis, layout


def chosen_layout_of(layout: str) -> str | None:
    """A Keras layer's layout as a choice: channels_first (axis=1) is one; channels_last is Keras's natural layout."""
    return "channels_first" if layout == "channels_first" else None
