"""Keras 3 adapter: keras.layers normalization layers <-> NormSpec, and whole keras.Model networks.

Importing this package does not import Keras: `INFO` (info.py) is read by the adapter registry at once, `FRAMEWORK`,
`MODEL` and `KIND_ADAPTERS` on first use, and the kind modules import Keras when a conversion runs, so the registry
can list adapters without paying for TensorFlow.
"""

from ..adapter import kind_adapters
from .info import INFO


def __getattr__(name: str):
    # FRAMEWORK, MODEL and KIND_ADAPTERS (kind -> the ADAPTER of keras_adapter/<kind>.py) are built on first use.
    if name in ("FRAMEWORK", "MODEL", "KIND_ADAPTERS"):
        from .framework import KerasFramework
        from .model import KerasModelAdapter

        globals().setdefault("FRAMEWORK", KerasFramework())
        globals().setdefault("MODEL", KerasModelAdapter())
        globals().setdefault("KIND_ADAPTERS", kind_adapters(__name__))
        return globals()[name]
    # Lazy, because defining the subclass imports Keras. Import it before
    # keras.models.load_model() on a file that holds one ("normbridge>UnbiasedBatchNormalization").
    if name == "UnbiasedBatchNormalization":
        from .unbiased_batch_normalization import UnbiasedBatchNormalization

        return UnbiasedBatchNormalization
    if name == "TrackedInstanceNormalization":  # "normbridge>TrackedInstanceNormalization", the same way
        from .tracked_instance_normalization import TrackedInstanceNormalization

        return TrackedInstanceNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FRAMEWORK", "INFO", "KIND_ADAPTERS", "MODEL", "TrackedInstanceNormalization", "UnbiasedBatchNormalization"]
