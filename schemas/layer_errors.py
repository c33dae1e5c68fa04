"""Errors renamed to the layer's path in its model, so a message names the layer where the user finds it.

A layer reader names a layer as it knows it (often a class name); whoever walks a whole model
knows its path ('features.1') and re-raises under it, keeping the setting. Shared by the model
adapters (reading a model for the registry) and the registry (rebuilding specs from a manifest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import NormbridgeError, SpecError


def layer_error(error: NormbridgeError, path: str) -> SpecError:
    """The error as a SpecError that names the layer by its path in the model (and keeps the setting)."""
    if error.layer == path and isinstance(error, SpecError):
        return error
    message = error.message
    if error.layer is not None:  # drop the reader's own layer prefix (a class name, not the model path)
        prefix = (
            f"layer '{error.layer}', setting '{error.setting}': "
            if error.setting is not None
            else f"layer '{error.layer}': "
        )
        message = message.removeprefix(prefix)
    return SpecError(message, layer=path, setting=error.setting)


def read_layer(read: Callable[[], Any], path: str | None) -> Any:
    """Run a spec reader; its errors name the layer by its path in the model (`path` None: as the reader named it)."""
    try:
        return read()
    except NormbridgeError as error:
        if path is None or error.layer == path:
            raise
        raise layer_error(error, path) from error


__all__ = ["layer_error", "read_layer"]
