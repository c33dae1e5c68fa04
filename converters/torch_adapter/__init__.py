"""PyTorch adapter: torch.nn normalization modules <-> NormSpec, and whole torch models (nn.Module, ExportedProgram)."""

from ..adapter import kind_adapters
from .framework import TorchFramework
from .model import TorchModelAdapter

FRAMEWORK = TorchFramework()
MODEL = TorchModelAdapter()

#: kind -> KindAdapter class: the ADAPTER of each module named after a kind (torch_adapter/<kind>.py).
KIND_ADAPTERS = kind_adapters(__name__)
