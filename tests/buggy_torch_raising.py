"""A PyTorch adapter package whose from_spec crashes (not a NormbridgeError) on layers named 'boom...': `check` lets
such an error out, and check_many must raise the same one, for the first spec in order
(tests/converters/gate/test_grouped_check.py)."""

from __future__ import annotations

# INFO: the framework facts an adapter package declares
from converters.torch_adapter import INFO, KIND_ADAPTERS as REAL_ADAPTERS  # noqa: F401
from converters.torch_adapter.framework import TorchFramework


def _crashing(adapter_class: type) -> type:
    def from_spec(self, spec, options, report):
        if spec.name.startswith("boom"):
            raise RuntimeError(f"{spec.name}: the adapter broke")
        return adapter_class.from_spec(self, spec, options, report)

    return type(f"Crashing{adapter_class.__name__}", (adapter_class,), {"from_spec": from_spec})


FRAMEWORK = TorchFramework()
KIND_ADAPTERS = {kind: _crashing(adapter_class) for kind, adapter_class in REAL_ADAPTERS.items()}
