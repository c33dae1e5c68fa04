"""PyTorch adapter: torch.nn normalization modules <-> NormSpec."""

from .batch import TorchBatchAdapter
from .framework import TorchFramework
from .group import TorchGroupAdapter
from .instance import TorchInstanceAdapter
from .layer import TorchLayerAdapter
from .rms import TorchRmsAdapter

FRAMEWORK = TorchFramework()

KIND_ADAPTERS = {
    "batch": TorchBatchAdapter,
    "layer": TorchLayerAdapter,
    "rms": TorchRmsAdapter,
    "group": TorchGroupAdapter,
    "instance": TorchInstanceAdapter,
}
