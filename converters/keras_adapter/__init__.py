"""Keras 3 adapter: keras.layers normalization layers <-> NormSpec, and whole keras.Model networks.

Importing this package does not import Keras: the kind modules import it when a
conversion runs, so the registry can list adapters without paying for TensorFlow.
"""

from ..adapter import kind_adapters
from .framework import KerasFramework
from .model import KerasModelAdapter

FRAMEWORK = KerasFramework()
MODEL = KerasModelAdapter()

#: kind -> KindAdapter class: the ADAPTER of each module named after a kind (keras_adapter/<kind>.py).
KIND_ADAPTERS = kind_adapters(__name__)


def __getattr__(name: str):
    # Lazy, because defining the subclass imports Keras. Import it before
    # keras.models.load_model() on a file that holds one ("normbridge>UnbiasedBatchNormalization").
    if name == "UnbiasedBatchNormalization":
        from .unbiased_batch_normalization import UnbiasedBatchNormalization

        return UnbiasedBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
