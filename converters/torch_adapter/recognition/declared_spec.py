"""The spec a `converters.recognize` declaration describes for one module instance (proved by the caller)."""

from __future__ import annotations

from typing import Any

import torch

from schemas import NormSpec, SpecError

from ...recognizers.declared import Declaration
from .derived_spec import build_spec, own_normalized_shape
from .norm_graph import Derivation, NotANormalization


def _tensor(module: torch.nn.Module, attribute: str | None, what: str) -> torch.Tensor | None:
    if attribute is None:
        return None
    value = getattr(module, attribute, None)
    if not isinstance(value, torch.Tensor):
        raise NotANormalization(f"its {what} attribute '{attribute}' is {type(value).__name__}, not a tensor")
    return value


def declared_spec(module: torch.nn.Module, declaration: Declaration, name: str) -> tuple[NormSpec, tuple[int, ...]]:
    """(spec, probe shape) of `module` read as `declaration` says."""
    eps = declaration.eps
    if isinstance(eps, str):
        eps = getattr(module, eps, None)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool):
            raise NotANormalization(f"its eps attribute '{declaration.eps}' holds {eps!r}, not a number")
    roles = {
        "scale": declaration.weight,
        "bias": declaration.bias,
        "running_mean": declaration.running_mean,
        "running_var": declaration.running_var,
    }
    state: dict[str, Any] = {}
    for role, attribute in list(roles.items()):
        tensor = _tensor(module, attribute, role)
        if tensor is None:
            roles.pop(role)
        else:
            state[attribute] = tensor
    own = own_normalized_shape(module)
    if not state and own is None:
        raise NotANormalization(
            "it declares no scale, bias or statistics and has no normalized_shape to size the layer"
        )
    sizes = (int(next(iter(state.values())).shape[0]),) if state else own
    fields: dict[str, Any] = {"eps": float(eps)}
    if declaration.kind == "batch":
        fields.update(
            num_features=sizes[0],
            spatial_rank=2,
            layout="channels_first",
            input_rank=4,
            track_running_stats=True,
            frozen=True,
        )
        shape = (4, sizes[0], 3, 5)
    else:
        fields["normalized_shape"] = sizes
        shape = (4, 3, *sizes)
        if declaration.layout == "channels_first":
            fields.update(layout="channels_first", input_rank=4)
            shape = (4, sizes[0], 3, 5)
    if declaration.scale_offset:
        fields["scale_offset"] = declaration.scale_offset
    if declaration.compute_dtype is not None:
        fields["compute_dtype"] = declaration.compute_dtype
        if declaration.cast_before_affine:
            fields["cast_before_affine"] = True
    derivation = Derivation(declaration.kind, fields, roles, ops=())
    dtype = next(iter(state.values())).dtype if state else torch.get_default_dtype()
    try:
        spec = build_spec(
            derivation,
            state,
            name=name,
            layer_type=type(module).__name__,
            training=bool(module.training),
            input_dtype=dtype,
        )
    except SpecError as error:
        raise NotANormalization(str(error)) from error
    return spec, shape
