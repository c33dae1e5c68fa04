"""Importing Keras (only when a conversion runs, on the TensorFlow backend unless the user chose another) and its
provenance."""

from __future__ import annotations

import functools
import os
from typing import Any

from schemas import Source

from ..lean_imports import optional_packages_kept_out


@functools.cache  # once imported, every later call (several per layer converted or read) returns it as it is
def import_keras():
    """Import Keras on the TensorFlow backend (unless the user chose another) with TF's logs quiet."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from ..native_order import prepare

    prepare()  # triton's native library before TensorFlow's (native_order.py)
    with (
        optional_packages_kept_out()
    ):  # normbridge's own processes: no scikit-learn, matplotlib, pandas (lean_imports.py)
        import keras

    return keras


def keras_class(name: str) -> type:
    """`keras.layers.<name>`."""
    return getattr(import_keras().layers, name)


def source(layer: Any) -> Source:
    return Source(framework="keras", framework_version=import_keras().__version__, layer_type=type(layer).__name__)
