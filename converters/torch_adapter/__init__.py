"""PyTorch adapter: torch.nn normalization modules <-> NormSpec, and whole torch models (nn.Module, ExportedProgram)."""

from ..native_order import prepare as _prepare_native_order

_prepare_native_order()  # before anything here reaches torch._dynamo, which imports triton (native_order.py)

from ..adapter import kind_adapters  # noqa: E402
from .framework import TorchFramework
from .model import TorchModelAdapter

FRAMEWORK = TorchFramework()
MODEL = TorchModelAdapter()

#: kind -> KindAdapter class: the ADAPTER of each module named after a kind (torch_adapter/<kind>.py).
KIND_ADAPTERS = kind_adapters(__name__)
