"""Turning a `Derivation` (what a module's ops compute) into a NormSpec with the module's own tensors."""

from __future__ import annotations

from typing import Any

import ml_dtypes  # noqa: F401  (NumPy's bfloat16)
import numpy as np
import torch

from schemas import NormSpec, Source, SpecError
from schemas.floats import dtype_default_eps

from ..torch_internals import torch_version
from .norm_graph import Derivation, NotANormalization

_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32", torch.float64: "float64"}
TORCH_OF = {name: dtype for dtype, name in _NAMES.items()}


def dtype_name(dtype: torch.dtype, what: str) -> str:
    if dtype not in _NAMES:
        raise NotANormalization(f"its {what} is {dtype}, not a floating dtype a spec holds")
    return _NAMES[dtype]


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A bit-exact NumPy copy; bfloat16 through ml_dtypes (NumPy has none of its own)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.clone().view(torch.int16).numpy().view(np.dtype("bfloat16"))
    return tensor.clone().numpy()


def to_torch(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A float64 array of values exact in `dtype` as a tensor of `dtype`."""
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64)).to(dtype)


def build_spec(
    derivation: Derivation,
    state: dict[str, torch.Tensor],
    *,
    name: str,
    layer_type: str,
    training: bool,
    input_dtype: torch.dtype,
    module_class: str | None = None,
) -> NormSpec:
    """The spec of `derivation` for one module whose state tensors (by their names in the module) are `state`;
    `module_class` (the class's import path) and the tensors' own names go into its provenance, to rebuild the class."""
    fields = dict(derivation.fields)
    tensors = {}
    for role, state_name in derivation.roles.items():
        if state_name not in state:
            raise NotANormalization(f"its {role} '{state_name}' is not one of its parameters or buffers")
        tensors[role] = state[state_name]
    dtype = dtype_name(next(iter(tensors.values())).dtype if tensors else input_dtype, "state")
    for role, tensor in tensors.items():
        if dtype_name(tensor.dtype, role) != dtype or tensor.dim() != 1:
            raise NotANormalization(
                f"its {role} is a {tuple(tensor.shape)} {tensor.dtype} tensor, not a vector of the layer's dtype"
            )
    if fields.get("compute_dtype") == dtype:
        fields.pop("compute_dtype")
        fields.pop("cast_before_affine", None)
    eps, origin = fields.pop("eps"), "explicit"
    if eps is None:  # rms_norm(eps=None): the eps of the dtype torch computes it in
        eps, origin = dtype_default_eps(fields.get("compute_dtype") or dtype), "dtype_eps"
    if derivation.kind == "rms" and "bias" in tensors:
        raise NotANormalization("it adds a bias after an RMS normalisation, which no RMSNorm holds")
    if fields.get("frozen"):
        training = False  # frozen statistics: the same output in either mode
    try:
        return NormSpec(
            name=name,
            kind=derivation.kind,
            eps=float(eps),
            eps_origin=origin,
            scale="scale" in tensors,
            bias="bias" in tensors,
            training=training if derivation.kind == "batch" else False,
            dtype=dtype,
            source=Source(
                framework="torch",
                framework_version=torch_version(),
                layer_type=layer_type,
                module_class=module_class,
                state_names=dict(derivation.roles) if module_class else None,
            ),
            tensors={role: to_numpy(t) for role, t in tensors.items()},
            **fields,
        )
    except SpecError as error:
        raise NotANormalization(f"what it computes is not a valid spec: {error}") from error


def scalar_attributes(module: Any) -> tuple:
    """The plain settings of a module (eps, data_format, shapes): with its class they decide what it traces to."""
    items = []
    for key, value in sorted(vars(module).items()):
        if key.startswith("_"):
            continue
        if isinstance(value, (bool, int, float, str, type(None))) or (
            isinstance(value, tuple) and all(isinstance(v, (int, float, str)) for v in value)
        ):
            items.append((key, value))
    return tuple(items)


def own_normalized_shape(module: torch.nn.Module) -> tuple[int, ...] | None:
    """A stateless module's own `normalized_shape` (an int or a tuple of positive ints), else None: what sizes a
    normalization that keeps no tensor (OLMo's LayerNorm), for the tracer's probe and for a declaration alike."""
    shape = getattr(module, "normalized_shape", None)
    shape = (shape,) if isinstance(shape, int) else shape
    if (
        isinstance(shape, (tuple, list, torch.Size))
        and shape
        and all(isinstance(d, int) and 0 < d <= 65536 for d in shape)
    ):
        return tuple(shape)
    return None
