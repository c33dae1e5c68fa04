"""A deliberately wrong PyTorch adapter package: it reads and writes RMSNorm(eps=None) as finfo(layer dtype).eps.

That is what torch's docs say and what normbridge shipped until stop 25, but torch adds float32's eps to a 16-bit layer
(it computes in float32). The pair is self-consistent (eps=None reads as 9.77e-4 and is written back as eps=None), so
every spec comparison agrees; only an output whose variance is near eps shows the difference. Loaded only into a
private AdapterRegistry by tests/converters/test_check.py; never registered globally.
"""

from __future__ import annotations

import torch

# INFO: the framework facts an adapter package declares
from converters.torch_adapter import INFO, KIND_ADAPTERS as REAL_ADAPTERS  # noqa: F401
from converters.torch_adapter.framework import TorchFramework


class LayerDtypeEpsRmsNorm(REAL_ADAPTERS["rms"]):
    def to_spec(self, obj, report):
        spec = super().to_spec(obj, report)
        return spec.replace(eps=float(torch.finfo(obj.weight.dtype).eps)) if obj.eps is None else spec

    def from_spec(self, spec, options, report):
        module = super().from_spec(spec, options, report)
        if spec.eps_origin == "dtype_eps" and spec.eps == float(torch.finfo(module.weight.dtype).eps):
            module.eps = None
        return module


FRAMEWORK = TorchFramework()
KIND_ADAPTERS = {**REAL_ADAPTERS, "rms": LayerDtypeEpsRmsNorm}
