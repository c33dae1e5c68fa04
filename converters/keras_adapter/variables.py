"""Keras dtypes and variables, read and written bit-exactly."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from schemas import NormSpec, NotExpressibleError, SpecError
from schemas.tensors import tensors_identical
from schemas.vocabulary import DTYPES


#: Spec tensor -> Keras attribute, for layers whose affine weights are gamma/beta.
AFFINE_VARIABLES: dict[str, str] = {"scale": "gamma", "bias": "beta"}


#: Keras mixed policies by the spec dtype they hold: inputs, outputs and state in that dtype, statistics in float32.
MIXED_POLICIES: dict[str, str] = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def layer_dtypes(layer: Any) -> tuple[str, str | None]:
    """(spec dtype, compute_dtype) of the layer: its one float dtype and None, or, under a mixed policy, (its compute dtype, "float32").

    Note [mixed policies]: `mixed_bfloat16` keeps float32 variables and casts inputs and outputs to bfloat16; Keras's
    normalization layers compute their statistics in float32 (ops.layer_normalization, BatchNormalization.call). The spec
    calls that a bfloat16 layer with compute_dtype float32; its state must be bfloat16 values, read exactly (`narrow_state`).
    """
    variable_dtype, compute_dtype = str(layer.variable_dtype), str(layer.compute_dtype)
    if variable_dtype != compute_dtype:
        if variable_dtype != "float32" or MIXED_POLICIES.get(compute_dtype) is None:
            raise SpecError(
                f"the layer uses the dtype policy '{layer.dtype_policy.name}' (variables {variable_dtype}, computation {compute_dtype}), "
                f"expected one dtype for both or {' or '.join(MIXED_POLICIES.values())}; rebuild it with dtype='{compute_dtype}'.",
                layer=layer.name, setting="dtype",
            )
        return compute_dtype, "float32"
    return layer_dtype(layer), None


def narrow_state(layer: Any, tensors: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """float32 variables of a mixed-policy layer as `dtype` tensors; SpecError naming the tensor when one is not exactly a `dtype` value."""
    out = {}
    for name, array in tensors.items():
        if name == "num_batches_tracked":
            out[name] = array
            continue
        narrow = array.astype(dtype)
        if not tensors_identical(narrow.astype(array.dtype), array):
            raise SpecError(
                f"the {layer.dtype_policy.name} layer's float32 variable for '{name}' holds values that are not {dtype} numbers, expected "
                f"{dtype}-exact state (a spec holds one dtype); rebuild the layer with dtype='float32' to convert it as a float32 layer.",
                layer=layer.name, setting=name)
        out[name] = narrow
    return out


def variable_dtype(spec: NormSpec) -> str:
    """The dtype of the Keras variables holding the spec's state: float32 under a mixed policy."""
    return "float32" if spec.compute_dtype is not None else spec.dtype


def layer_dtype(layer: Any) -> str:
    """The single float dtype of the layer's variables and computation; SpecError otherwise."""
    found = sorted({str(variable.dtype) for variable in layer.weights} or {str(layer.variable_dtype)})
    if len(found) > 1 or found[0] not in DTYPES:
        raise SpecError(
            f"the layer's variables have dtype {', '.join(found)}, expected one of {', '.join(DTYPES)}; rebuild it with dtype='float32'.",
            layer=layer.name,
            setting="dtype",
        )
    return found[0]


def check_spec_dtype(spec: NormSpec) -> str:
    """The Keras dtype (or mixed policy, for float32 statistics of a bf16/fp16 layer) holding the spec's dtype bit-exactly."""
    if spec.dtype not in DTYPES:
        raise SpecError(
            f"dtype {spec.dtype!r} is not supported, expected one of {', '.join(DTYPES)}; convert the spec's tensors to float32.",
            layer=spec.name,
            setting="dtype",
        )
    if spec.compute_dtype is None:
        return spec.dtype
    if spec.compute_dtype != "float32" or spec.dtype not in MIXED_POLICIES:
        raise NotExpressibleError(
            f"Keras computes a {spec.dtype} layer's statistics in float32 only under {' or '.join(MIXED_POLICIES.values())}, "
            f"not in compute_dtype={spec.compute_dtype!r}; keep the layer in its source framework.",
            layer=spec.name, setting="compute_dtype", target="keras")
    return MIXED_POLICIES[spec.dtype]


def read_variable(variable: Any) -> np.ndarray:
    """A bit-exact NumPy copy of a Keras variable.

    On TensorFlow, one ReadVariableOp of the tf.Variable it holds (`value()`): `numpy()` runs that op and an Identity of
    its result, twice the eager dispatch for the same bytes."""
    held = getattr(variable, "value", None)
    if type(held).__module__.startswith("tensorflow.") and callable(getattr(held, "value", None)):
        return np.array(held.value().numpy(), copy=True)
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
