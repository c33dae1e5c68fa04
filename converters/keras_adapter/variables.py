"""Keras dtypes and variables, read and written bit-exactly."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from schemas import NormSpec, SpecError
from schemas.tensors import tensors_identical
from schemas.vocabulary import DTYPES


#: Spec tensor -> Keras attribute, for layers whose affine weights are gamma/beta.
AFFINE_VARIABLES: dict[str, str] = {"scale": "gamma", "bias": "beta"}


def layer_dtype(layer: Any) -> str:
    """The single float dtype of the layer's variables and computation; SpecError otherwise."""
    variable_dtype, compute_dtype = str(layer.variable_dtype), str(layer.compute_dtype)
    if variable_dtype != compute_dtype:
        raise SpecError(
            f"the layer uses the mixed dtype policy '{layer.dtype_policy.name}' (variables {variable_dtype}, computation {compute_dtype}), "
            f"expected one dtype for both; rebuild it with dtype='{variable_dtype}' or dtype='{compute_dtype}'.",
            layer=layer.name,
            setting="dtype",
        )
    found = sorted({str(variable.dtype) for variable in layer.weights} or {variable_dtype})
    if len(found) > 1 or found[0] not in DTYPES:
        raise SpecError(
            f"the layer's variables have dtype {', '.join(found)}, expected one of {', '.join(DTYPES)}; rebuild it with dtype='float32'.",
            layer=layer.name,
            setting="dtype",
        )
    return found[0]


def check_spec_dtype(spec: NormSpec) -> str:
    """The spec's dtype, if Keras layers can hold it bit-exactly."""
    if spec.dtype not in DTYPES:
        raise SpecError(
            f"dtype {spec.dtype!r} is not supported, expected one of {', '.join(DTYPES)}; convert the spec's tensors to float32.",
            layer=spec.name,
            setting="dtype",
        )
    return spec.dtype


def read_variable(variable: Any) -> np.ndarray:
    """A bit-exact NumPy copy of a Keras variable."""
    return np.array(variable.numpy(), copy=True)


def read_variables(layer: Any, variables: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Spec tensors from the layer's variables (absent ones, e.g. gamma with scale=False, are skipped)."""
    out = {}
    for tensor_name, attribute in variables.items():
        variable = getattr(layer, attribute, None)
        if variable is not None:
            out[tensor_name] = read_variable(variable)
    return out


def assign_variable(layer: Any, attribute: str, array: np.ndarray, setting: str) -> None:
    """Write `array` into `layer.<attribute>` bit-exactly (see write_variable)."""
    variable = getattr(layer, attribute, None)
    if variable is None:
        raise SpecError(f"the Keras layer has no '{attribute}' variable to hold tensor '{setting}'; the spec's flags and tensors disagree.", layer=layer.name, setting=setting)
    write_variable(variable, array, layer=layer.name, setting=setting)


def write_variable(variable: Any, array: np.ndarray, *, layer: str, setting: str) -> None:
    """Assign `array` to `variable` and verify it reads back bit-identically (same dtype, shape and bytes)."""
    if tuple(variable.shape) != tuple(array.shape) or str(variable.dtype) != str(array.dtype):
        raise SpecError(
            f"tensor '{setting}' is {array.dtype}{list(array.shape)}, expected {variable.dtype}{list(variable.shape)} for Keras variable '{variable.path}'.",
            layer=layer,
            setting=setting,
        )
    variable.assign(array)
    if not tensors_identical(read_variable(variable), np.asarray(array)):
        raise SpecError(f"Keras variable '{variable.path}' did not read back bit-identical to tensor '{setting}' after assignment.", layer=layer, setting=setting)
