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
    """(spec dtype, compute_dtype) of the layer: its one float dtype and None, or, under a mixed policy,
    (its compute dtype, "float32").

    Note [mixed policies]: `mixed_bfloat16` keeps float32 variables and casts inputs and outputs to bfloat16; Keras's
    normalization layers compute their statistics in float32 (ops.layer_normalization, BatchNormalization.call). The
    spec calls that a bfloat16 layer with compute_dtype float32. Its state is read as bfloat16 tensors when every
    variable holds exact bfloat16 values, else as the float32 tensors with state_dtype float32 (`narrow_state`): the
    layers cast their variables to the float32 compute dtype and apply them there (BatchNormalization.call,
    GroupNormalization, ops.layer_normalization/rms_normalization), so both spellings compute what the layer does.
    """
    variable_dtype, compute_dtype = str(layer.variable_dtype), str(layer.compute_dtype)
    if variable_dtype != compute_dtype:
        if variable_dtype != "float32" or MIXED_POLICIES.get(compute_dtype) is None:
            raise SpecError(
                f"the layer uses the dtype policy '{layer.dtype_policy.name}' (variables {variable_dtype}, computation {compute_dtype}), "
                f"expected one dtype for both or {' or '.join(MIXED_POLICIES.values())}; rebuild it with dtype='{compute_dtype}'.",
                layer=layer.name,
                setting="dtype",
            )
        return compute_dtype, "float32"
    return layer_dtype(layer), None


def narrow_state(layer: Any, tensors: dict[str, np.ndarray], dtype: str) -> tuple[dict[str, np.ndarray], str | None]:
    """(tensors, state_dtype) of a mixed-policy layer's float32 variables: `dtype` tensors and None when every one is
    exactly a `dtype` value (the narrow spec computes the same and converts further), else the float32 tensors as they
    are and "float32" (a trained layer: Keras applies them in float32, see Note [mixed policies])."""
    autocast = autocast_variables(layer)
    out = {}
    for name, array in tensors.items():
        if name == "num_batches_tracked":
            out[name] = array
            continue
        narrow = array.astype(dtype)
        if not autocast and not tensors_identical(narrow.astype(array.dtype), array):
            return tensors, str(array.dtype)
        out[name] = narrow
    return out, None


def autocast_variables(layer: Any) -> bool:
    """Whether the mixed layer's call reads its variables rounded to its compute dtype (Keras autocasting).

    Note [autocast]: a Keras layer under a mixed policy calls itself in an AutocastScope, which casts every variable
    created with autocast=True to the compute dtype when read, unless the layer sets `autocast = False`.
    RMSNormalization does neither: its float32 `scale` is rounded to float16/bfloat16 before `ops.rms_normalization`
    widens it again, so the spec holds those rounded values (what it computes with, and what tf2onnx exports).
    LayerNormalization and GroupNormalization turn autocasting off, BatchNormalization creates its variables with
    autocast=False: their float32 values are applied in float32 (state_dtype float32 unless they are exact `dtype`
    values)."""
    if not getattr(layer, "autocast", True):
        return False
    from .keras_internals import autocasts

    flags = {autocasts(variable) for variable in layer.weights}
    if len(flags) > 1:
        raise SpecError(
            f"the {layer.dtype_policy.name} layer autocasts some of its variables to {layer.compute_dtype} and not others; "
            f"rebuild it with dtype='float32'.",
            layer=layer.name,
            setting="dtype",
        )
    return flags == {True}


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
    """The Keras dtype (or mixed policy, for float32 statistics of a bf16/fp16 layer) holding the spec's dtype
    bit-exactly."""
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
            layer=spec.name,
            setting="compute_dtype",
            target="keras",
        )
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
        raise SpecError(
            f"the Keras layer has no '{attribute}' variable to hold tensor '{setting}'; the spec's flags and tensors disagree.",
            layer=layer.name,
            setting=setting,
        )
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
        raise SpecError(
            f"Keras variable '{variable.path}' did not read back bit-identical to tensor '{setting}' after assignment.",
            layer=layer,
            setting=setting,
        )
