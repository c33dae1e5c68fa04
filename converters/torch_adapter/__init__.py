"""PyTorch adapter: torch.nn normalization modules <-> NormSpec, and whole torch models (nn.Module, ExportedProgram).

Importing this package does not import torch: `INFO` (info.py) is read by the adapter registry at once, `FRAMEWORK`,
`MODEL` and `KIND_ADAPTERS` on first use (their modules import torch).
"""

from ..native_order import prepare as _prepare_native_order

_prepare_native_order()  # before anything here reaches torch._dynamo, which imports triton (native_order.py)

from ..adapter import kind_adapters  # noqa: E402
from .info import INFO  # noqa: E402


def __getattr__(name: str):
    # FRAMEWORK, MODEL and KIND_ADAPTERS (kind -> the ADAPTER of torch_adapter/<kind>.py) are built on first use.
    if name in ("FRAMEWORK", "MODEL", "KIND_ADAPTERS"):
        from .framework import TorchFramework
        from .model import TorchModelAdapter

        globals().setdefault("FRAMEWORK", TorchFramework())
        globals().setdefault("MODEL", TorchModelAdapter())
        globals().setdefault("KIND_ADAPTERS", kind_adapters(__name__))
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FRAMEWORK", "INFO", "KIND_ADAPTERS", "MODEL"]
