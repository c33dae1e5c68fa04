"""Each stored layer's status: the offline `drift` command's convergence rule applied to a serving window against the
version's stored statistics (converters/models/monitoring/convergence.py).

A layer over a threshold whose running statistics never converged (few tracked batches for the momentum, running
variance still near its initial 1) is `unconverged_statistics`, not `drift`; so is a layer whose statistics are exactly
the initial values, over or not, and an alarm downstream of an unconverged layer (in eval mode that layer normalizes
with statistics its training batches never had), unless the later layer's own batch counter says it converged. Only
`drift` makes a window count toward the sustained-shift rule.
"""

from __future__ import annotations

import numpy as np

from converters.models.monitoring.convergence import Convergence, blamed_on_unconverged, judge
from registry.drift_reference import ReferenceLayer
from schemas.monitoring import DriftRule, LayerShift
from schemas.serving import DriftThresholds


def layer_status(mean, var, reference: ReferenceLayer, active: DriftRule, over: bool) -> Convergence:
    """ok, drift or unconverged_statistics for one layer of a window, judged as `drift` judges it."""
    thresholds = DriftThresholds(shift=active.shift, log_ratio=active.log_ratio)
    return judge(
        np.asarray(mean, dtype=np.float64),
        np.asarray(var, dtype=np.float64),
        reference.running_mean,
        reference.running_var,
        reference.eps,
        thresholds,
        over,
        reference.batches_tracked,
        reference.momentum,
    )


def downstream_of_unconverged(shifts: list[LayerShift]) -> list[LayerShift]:
    """Drift after the first unconverged layer (the window's order, which the collector takes from execution) is that
    layer's doing, not the input's: the offline `drift` command's rule (convergence.blamed_on_unconverged)."""
    _, blamed = blamed_on_unconverged(shifts)
    return [
        s.model_copy(update={"status": "unconverged_statistics"}) if i in blamed else s for i, s in enumerate(shifts)
    ]


__all__ = ["downstream_of_unconverged", "layer_status"]
