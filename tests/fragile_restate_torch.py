"""A PyTorch adapter package whose `restate` refuses layers named 'fragile...' (a SpecError, which check would record as
the target's failure) while from_spec builds them fine: check_many must then build that member with from_spec and give
check's result, a pass (tests/converters/gate/test_grouped_check.py)."""

from __future__ import annotations

# INFO: the framework facts an adapter package declares
from converters.torch_adapter import INFO, KIND_ADAPTERS as REAL_ADAPTERS  # noqa: F401
from schemas import SpecError
from converters.torch_adapter.framework import TorchFramework


def _fragile(adapter_class: type) -> type:
    def from_spec(self, spec, options, report):
        return adapter_class.from_spec(self, spec, options, report)

    def restate(self, module, spec, template):
        if spec.name.startswith("fragile"):
            raise SpecError(
                "restate gave up", layer=spec.name, setting="scale"
            )  # check would record it as the target's failure
        adapter_class.restate(self, module, spec, template)

    return type(
        f"Fragile{adapter_class.__name__}",
        (adapter_class,),
        {"from_spec": from_spec, "restate": restate, "restatable": True},
    )


FRAMEWORK = TorchFramework()
KIND_ADAPTERS = {kind: _fragile(adapter_class) for kind, adapter_class in REAL_ADAPTERS.items()}
