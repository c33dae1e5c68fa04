"""Spec fields a framework object cannot hold natively, remembered on the in-memory object.

A PyTorch module has no name and no way to say "this bias is frozen at zero because
the source had none"; a Keras layer has no train/eval flag and no num_batches_tracked.
Adapters keep such fields in one attribute so that a round trip through the object
returns the spec exactly. The attribute lives only in memory: it is not saved by
torch.save or .keras files, and adapters trust it only when it agrees with the object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ATTRIBUTE = "_normbridge_extras"


def remember(obj: Any, **fields: Any) -> None:
    """Attach `fields` to `obj` (merged with what is already there)."""
    extras = dict(getattr(obj, ATTRIBUTE, {}) or {})
    extras.update(fields)
    object.__setattr__(obj, ATTRIBUTE, extras)


def recall(obj: Any) -> dict[str, Any]:
    """The fields remembered on `obj`, or an empty dict."""
    extras = getattr(obj, ATTRIBUTE, None)
    return dict(extras) if isinstance(extras, dict) else {}


def replace(obj: Any, fields: dict[str, Any]) -> None:
    """Make `fields` all that is remembered on `obj` (a layer given another layer's name and state:
    converters/gate/group_objects.py)."""
    object.__setattr__(obj, ATTRIBUTE, dict(fields))


def restorer(obj: Any) -> Callable[[], None]:
    """A function that makes what is remembered on `obj` again what it is now (nothing, if nothing is): a port's undo
    (each framework's `porting.snapshot`) puts the markers back with the tensors."""
    extras = getattr(obj, ATTRIBUTE, None)

    def restore() -> None:
        if extras is None:
            if ATTRIBUTE in obj.__dict__:
                object.__delattr__(obj, ATTRIBUTE)
        else:
            object.__setattr__(obj, ATTRIBUTE, extras)

    return restore
