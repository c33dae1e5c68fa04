"""A deliberately wrong PyTorch adapter package whose bug depends on the layer's state, not its configuration.

Every kind's from_spec saturates the scale at SATURATION (as a cast through a narrow fixed-point type would): a layer
whose scale stays below it converts exactly, one with a larger scale element does not. A grouped check builds each
configuration's object once; this proves it still judges every member on its own state. Loaded only into private
AdapterRegistries by the tests; never registered globally.
"""

from __future__ import annotations

import torch

# INFO: the framework facts an adapter package declares
from converters.torch_adapter import INFO, KIND_ADAPTERS as REAL_ADAPTERS  # noqa: F401
from converters.torch_adapter.framework import TorchFramework

SATURATION = 4.0


def _saturating(adapter_class: type) -> type:
    def from_spec(self, spec, options, report):
        module = adapter_class.from_spec(self, spec, options, report)
        weight = getattr(module, "weight", None)
        if weight is not None:
            with torch.no_grad():
                weight.clamp_(max=SATURATION)
        return module

    return type(f"Saturating{adapter_class.__name__}", (adapter_class,), {"from_spec": from_spec})


FRAMEWORK = TorchFramework()
KIND_ADAPTERS = {kind: _saturating(adapter_class) for kind, adapter_class in REAL_ADAPTERS.items()}
