"""The stock torch.nn normalization modules: BatchNorm1d/2d/3d, LayerNorm, RMSNorm, GroupNorm, InstanceNorm1d/2d/3d.

The class names are each kind's KindInfo.classes["torch"]; a user's subclass of one is that kind.
"""

from __future__ import annotations

from typing import Any

import torch

from schemas import UnsupportedObjectError
from schemas.kinds import KIND_INFO

from ...recognizers.base import ObjectRecognizer


def _class_names(names: tuple[str, ...]) -> str:
    """'BatchNorm1d/2d/3d' for the three ranks of one class, else the names joined by '/'."""
    if len(names) > 1 and all(n[:-2] == names[0][:-2] and n[-1] == "d" for n in names):
        return names[0] + "/" + "/".join(n[-2:] for n in names[1:])
    return "/".join(names)


_NAMES = [_class_names(info.stock_classes("torch")) for info in KIND_INFO.values() if info.stock_classes("torch")]
#: The stock classes, as named in messages.
SUPPORTED = ", ".join(_NAMES[:-1]) + " or " + _NAMES[-1]


class TorchModules(ObjectRecognizer):
    """A torch.nn.Module that is an instance of a kind's stock class; the first kind in KIND_INFO order decides."""

    name = "torch.modules"
    framework = "torch"

    def __init__(self):
        self.classes = tuple(
            (tuple(getattr(torch.nn, n) for n in info.stock_classes("torch")), kind) for kind, info in KIND_INFO.items()
        )

    def kind_of(self, obj: Any) -> str | None:
        if not isinstance(obj, torch.nn.Module):
            return None
        if isinstance(obj, (torch.nn.SyncBatchNorm, torch.nn.modules.lazy.LazyModuleMixin)):
            raise UnsupportedObjectError(
                f"got a {type(obj).__name__}, whose spatial rank or size is not fixed; convert it to BatchNorm{{1,2,3}}d (or materialise it) first."
            )
        for classes, kind in self.classes:
            if isinstance(obj, classes):
                return kind
        return None


RECOGNIZER = TorchModules()
