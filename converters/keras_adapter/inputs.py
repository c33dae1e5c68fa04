"""A Keras model's inputs as it takes them: flat arrays (in `model.inputs` order) packed into its input structure.

normbridge feeds models a flat tuple of arrays; a functional model built on a dict of inputs
(keras_hub's backbones: token_ids, padding_mask) must be called with that dict, not a list.
"""

from __future__ import annotations

from typing import Any

from .keras_internals import inputs_structure
from .runtime import import_keras


def pack_inputs(model: Any, flat: list) -> Any:
    """`flat` in the structure `model` was built on: one tensor, a list, or a dict keyed by input name."""
    structure = inputs_structure(model)
    if (
        isinstance(structure, dict)
        or isinstance(structure, (list, tuple))
        and any(isinstance(s, (dict, list, tuple)) for s in structure)
    ):
        keras = import_keras()
        if len(keras.tree.flatten(structure)) == len(flat):
            return keras.tree.pack_sequence_as(structure, flat)
    return flat[0] if len(flat) == 1 else list(flat)
