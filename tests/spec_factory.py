"""Build valid NormSpecs with random but reproducible state, for every kind: the one spec factory of the tests.

`make_spec` takes the knobs the case table (tests/cases.py) varies; `spec_with` takes NormSpec's
own fields over a small per-kind default, for tests that spell out a scenario field by field.
"""

from __future__ import annotations

import numpy as np

from schemas import NormSpec
from schemas.kinds import KIND_INFO


def random_state(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    dtype: str,
    *,
    scale: bool,
    bias: bool,
    tracked: bool,
    nbt: int | None,
) -> dict:
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
    """A valid spec of `kind`; only the arguments that matter for the kind are used (its KindInfo says which)."""
    info = KIND_INFO[kind]
    rng = np.random.default_rng(seed)
    if tracked is None:
        tracked = kind == "batch"
    tracked = tracked and info.running_stats
    bias = bias and info.bias
    common = dict(
        name=name or f"{kind}_layer",
        kind=kind,
        eps=eps,
        eps_origin=eps_origin,
        training=training,
        dtype=dtype,
        source={"framework": source},
    )
    shape = tuple(normalized_shape) if info.trailing else (num_features,)
    tensors = random_state(rng, shape, dtype, scale=scale, bias=bias, tracked=tracked, nbt=nbt)
    knobs = dict(
        num_features=num_features,
        spatial_rank=spatial_rank,
        layout=layout,
        num_groups=num_groups,
        normalized_shape=tuple(normalized_shape),
    )
    fields = {field: knobs[field] for field in info.required}
    if info.running_stats:
        fields.update(
            momentum=momentum if tracked else None,
            momentum_convention=convention if (tracked and momentum is not None) else None,
            track_running_stats=tracked,
            variance_estimator=estimator if tracked else None,
        )
    return NormSpec(**common, **fields, scale=scale, bias=bias, tensors=tensors)


def per_feature(shape, dtype: str, seed: int, positive: bool = False) -> np.ndarray:
    """Reproducible values: standard normal, or uniform in [0.5, 2) where they must be positive (a variance)."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape)
    return values.astype(dtype)


#: The fields spec_with starts from, per kind.
FIELD_DEFAULTS = {
    "batch": dict(num_features=3, spatial_rank=2, layout="channels_first", track_running_stats=True),
    "instance": dict(num_features=3, spatial_rank=2, layout="channels_first"),
    "group": dict(num_features=6, num_groups=2, layout="channels_first"),
    "layer": dict(normalized_shape=(4, 5)),
    "rms": dict(normalized_shape=(5,)),
}


def spec_with(
    kind: str,
    *,
    dtype: str = "float32",
    scale: bool = True,
    bias: bool = True,
    seed: int = 1,
    tensors: dict | None = None,
    extra_tensors: dict | None = None,
    **fields,
) -> NormSpec:
    """A spec of `kind` from NormSpec fields over FIELD_DEFAULTS[kind], named '<kind>_norm' unless `name` is given.

    Its state follows its flags: scale (seed), bias (seed + 1), running mean and variance
    (seed + 2, seed + 3) when statistics are tracked. `tensors` replaces that state, `extra_tensors`
    is added to it (a num_batches_tracked, say).
    """
    base = {**FIELD_DEFAULTS[kind], **fields}
    shape = tuple(base["normalized_shape"]) if KIND_INFO[kind].trailing else (base["num_features"],)
    if tensors is None:
        tensors = {}
        if scale:
            tensors["scale"] = per_feature(shape, dtype, seed)
        if bias:
            tensors["bias"] = per_feature(shape, dtype, seed + 1)
        if base.get("track_running_stats"):
            tensors["running_mean"] = per_feature(shape, dtype, seed + 2)
            tensors["running_var"] = per_feature(shape, dtype, seed + 3, positive=True)
    tensors = {**tensors, **(extra_tensors or {})}
    base.setdefault("name", f"{kind}_norm")
    return NormSpec(kind=kind, dtype=dtype, scale=scale, bias=bias, tensors=tensors, **base)
