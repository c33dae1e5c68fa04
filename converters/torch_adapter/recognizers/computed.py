"""A torch module that is no stock class but computes a normalization: traced, read and proved.

Asked before `modules.py`, because a subclass of a stock class with its own forward (ConvNeXt's
channels_first LayerNorm) computes something else than its base; a subclass whose forward does
more than normalise (timm's BatchNormAct2d adds an activation) is left to `modules.py`, which
reads its normalization part. The work is in `torch_adapter/recognition/computed.py`.
"""

from __future__ import annotations

from typing import Any

from ...recognizers.base import ObjectRecognizer


class TorchComputed(ObjectRecognizer):
    """The kind a candidate module is proved to compute (converters.recognize declarations first), else None."""

    name = "torch.computed"
    framework = "torch"

    def kind_of(self, obj: Any) -> str | None:
        from ..recognition.computed import recognition

        found = recognition(obj)
        return None if found is None or found.spec is None else found.spec.kind


RECOGNIZER = TorchComputed()
