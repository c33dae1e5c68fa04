"""A deliberately wrong PyTorch adapter package: the bugs the field ships, to prove `check` catches them.

Loaded only into a private AdapterRegistry by tests/converters/test_check.py; never registered globally.
"""

from __future__ import annotations

import torch

# INFO: the framework facts an adapter package declares
from converters.torch_adapter import INFO, KIND_ADAPTERS as REAL_ADAPTERS  # noqa: F401
from converters.torch_adapter.framework import TorchFramework


class DefaultEpsLayerNorm(REAL_ADAPTERS["layer"]):
    """Writes PyTorch's default eps instead of the source's (the most common converter bug)."""

    def from_spec(self, spec, options, report):
        module = super().from_spec(spec, options, report)
        module.eps = 1e-5
        return module


class DroppedStatsBatchNorm(REAL_ADAPTERS["batch"]):
    """Forgets to copy the running statistics (leaves PyTorch's initial zeros and ones)."""

    def from_spec(self, spec, options, report):
        module = super().from_spec(spec, options, report)
        with torch.no_grad():
            module.running_mean.zero_()
            module.running_var.fill_(1.0)
        return module


FRAMEWORK = TorchFramework()
KIND_ADAPTERS = {**REAL_ADAPTERS, "layer": DefaultEpsLayerNorm, "batch": DroppedStatsBatchNorm}
