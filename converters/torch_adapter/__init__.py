"""PyTorch adapter: torch.nn normalization modules <-> NormSpec, and whole torch models (nn.Module, ExportedProgram)."""

from .batch import TorchBatchAdapter
from .framework import TorchFramework
from .group import TorchGroupAdapter
from .instance import TorchInstanceAdapter
from .layer import TorchLayerAdapter
from .model import TorchModelAdapter
from .rms import TorchRmsAdapter

FRAMEWORK = TorchFramework()
MODEL = TorchModelAdapter()

KIND_ADAPTERS = {
    "batch": TorchBatchAdapter,
    "layer": TorchLayerAdapter,
    "rms": TorchRmsAdapter,
    "group": TorchGroupAdapter,
    "instance": TorchInstanceAdapter,
}
