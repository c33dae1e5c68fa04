"""What toynp's kind adapters share: its provenance, and the one dtype it holds."""

from __future__ import annotations

from schemas import NotExpressibleError, Source


def source(obj) -> Source:
    import toynp

    return Source(framework="toynp", framework_version=toynp.__version__, layer_type=type(obj).__name__)


def require_float32(spec) -> None:
    if spec.dtype != "float32":
        raise NotExpressibleError(
            f"toynp layers hold float32 only (got {spec.dtype}).", layer=spec.name, setting="dtype", target="toynp"
        )
