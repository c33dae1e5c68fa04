"""toynp's FrameworkAdapter: which kind a layer is, and running it."""

from __future__ import annotations

import numpy as np

from converters.adapter import FrameworkAdapter
from schemas import UnsupportedObjectError

KINDS = {"LayerNorm": "layer", "ScaleNorm": "scalenorm"}


class ToyFramework(FrameworkAdapter):
    name = "toynp"

    def kind_of(self, obj) -> str:
        kind = KINDS.get(type(obj).__name__)
        if kind is None:
            raise UnsupportedObjectError(f"got a toynp {type(obj).__name__}, expected one of {', '.join(KINDS)}.")
        return kind

    def version(self) -> str:
        import toynp

        return toynp.__version__

    def natural_layout(self) -> str | None:
        return None

    def run_eval(self, obj, x: np.ndarray, in_place: bool = False) -> np.ndarray:
        return obj(x)

    def run_train_step(self, obj, x: np.ndarray, in_place: bool = False):
        return obj(x), None, None  # no running statistics
