"""Build valid NormSpecs with random but reproducible state, for every kind."""

from __future__ import annotations

import numpy as np

from schemas import NormSpec


def random_state(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, *, scale: bool, bias: bool, tracked: bool, nbt: int | None) -> dict:
    """Scale near 1, bias near 0, running mean anywhere, running var positive (never at initial values)."""
    tensors: dict[str, np.ndarray] = {}
    if scale:
        tensors["scale"] = rng.uniform(0.5, 1.5, shape).astype(dtype)
    if bias:
        tensors["bias"] = rng.normal(0.0, 0.5, shape).astype(dtype)
    if tracked:
        tensors["running_mean"] = rng.normal(0.0, 1.0, shape).astype(dtype)
        tensors["running_var"] = rng.uniform(0.2, 3.0, shape).astype(dtype)
        if nbt is not None:
            tensors["num_batches_tracked"] = np.array(nbt, dtype=np.int64)
    return tensors


def make_spec(
    kind: str,
    *,
    seed: int = 0,
    dtype: str = "float32",
    eps: float = 1e-3,
    momentum: float | None = 0.01,
    convention: str = "batch_weight",
    layout: str = "channels_first",
    scale: bool = True,
    bias: bool = True,
    tracked: bool | None = None,
    training: bool = False,
    spatial_rank: int = 2,
    num_features: int = 6,
    num_groups: int = 3,
    normalized_shape: tuple[int, ...] = (4, 5),
    estimator: str = "unbiased",
    nbt: int | None = 7,
    name: str | None = None,
    eps_origin: str = "explicit",
    source: str = "spec",
) -> NormSpec:
    """A valid spec of `kind`; only the arguments that matter for the kind are used."""
    rng = np.random.default_rng(seed)
    if tracked is None:
        tracked = kind == "batch"
    common = dict(name=name or f"{kind}_layer", kind=kind, eps=eps, eps_origin=eps_origin, training=training, dtype=dtype, source={"framework": source})
    if kind in ("batch", "instance"):
        tensors = random_state(rng, (num_features,), dtype, scale=scale, bias=bias, tracked=tracked, nbt=nbt)
        return NormSpec(
            **common, num_features=num_features, spatial_rank=spatial_rank, layout=layout, scale=scale, bias=bias,
            momentum=momentum if tracked else None,
            momentum_convention=convention if (tracked and momentum is not None) else None,
            track_running_stats=tracked, variance_estimator=estimator if tracked else None, tensors=tensors,
        )
    if kind == "group":
        tensors = random_state(rng, (num_features,), dtype, scale=scale, bias=bias, tracked=False, nbt=None)
        return NormSpec(**common, num_features=num_features, num_groups=num_groups, layout=layout, scale=scale, bias=bias, tensors=tensors)
    if kind == "layer":
        tensors = random_state(rng, tuple(normalized_shape), dtype, scale=scale, bias=bias, tracked=False, nbt=None)
        return NormSpec(**common, normalized_shape=tuple(normalized_shape), scale=scale, bias=bias, tensors=tensors)
    if kind == "rms":
        tensors = random_state(rng, tuple(normalized_shape), dtype, scale=scale, bias=False, tracked=False, nbt=None)
        return NormSpec(**common, normalized_shape=tuple(normalized_shape), scale=scale, bias=False, tensors=tensors)
    raise ValueError(kind)
