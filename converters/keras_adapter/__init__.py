"""Keras 3 adapter: keras.layers normalization layers <-> NormSpec, and whole keras.Model networks.

Importing this package does not import Keras: the kind modules import it when a
conversion runs, so the registry can list adapters without paying for TensorFlow.
"""

from .batch import KerasBatchAdapter
from .framework import KerasFramework
from .group import KerasGroupAdapter
from .instance import KerasInstanceAdapter
from .layer import KerasLayerAdapter
from .model import KerasModelAdapter
from .rms import KerasRmsAdapter

FRAMEWORK = KerasFramework()
MODEL = KerasModelAdapter()

KIND_ADAPTERS = {
    "batch": KerasBatchAdapter,
    "layer": KerasLayerAdapter,
    "rms": KerasRmsAdapter,
    "group": KerasGroupAdapter,
    "instance": KerasInstanceAdapter,
}


def __getattr__(name: str):
    # Lazy, because defining the subclass imports Keras. Import it before
    # keras.models.load_model() on a file that holds one ("normbridge>UnbiasedBatchNormalization").
    if name == "UnbiasedBatchNormalization":
        from .unbiased_batch_normalization import UnbiasedBatchNormalization

        return UnbiasedBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
