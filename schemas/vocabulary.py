"""The closed vocabularies of the spec: kinds, layouts, conventions, dtypes, frameworks."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Annotated, Literal

from pydantic import AfterValidator, WithJsonSchema

#: The normalizer kinds normbridge understands.
Kind = Literal["batch", "layer", "rms", "group", "instance"]
KINDS: tuple[str, ...] = ("batch", "layer", "rms", "group", "instance")

#: Kinds whose statistics are per channel (they have a channel axis and a layout).
CHANNEL_KINDS: tuple[str, ...] = ("batch", "group", "instance")
#: Kinds normalising over trailing axes (they have a normalized_shape).
TRAILING_KINDS: tuple[str, ...] = ("layer", "rms")

#: Which axis holds the channels in the layer's own framework.
Layout = Literal["channels_first", "channels_last"]

#: How a momentum value is meant.
#: `batch_weight`: running = (1 - m) * running + m * batch   (PyTorch)
#: `running_weight`: running = m * running + (1 - m) * batch (Keras, ONNX)
MomentumConvention = Literal["batch_weight", "running_weight"]

#: Which batch-variance estimator updates the running variance.
#: PyTorch uses the unbiased one (n - 1); Keras 3 and ONNX the biased one (n).
VarianceEstimator = Literal["unbiased", "biased"]

#: Where the eps value came from: written explicitly, or PyTorch RMSNorm's `eps=None`
#: (meaning the eps of the dtype torch computes in, floats.dtype_default_eps, which we store as its number too).
EpsOrigin = Literal["explicit", "dtype_eps"]

Framework = Literal["torch", "keras", "onnx", "spec"]
FRAMEWORKS: tuple[str, ...] = ("torch", "keras", "onnx")
#: Frameworks registered at run time (converters.adapters.REGISTRY.register_framework), after the stock ones.
_added_frameworks: list[str] = []


def add_framework(name: str) -> None:
    """Let specs name framework `name` as their source (the adapter registry calls this when it registers one)."""
    if name not in FRAMEWORKS and name not in _added_frameworks:
        _added_frameworks.append(name)


def remove_framework(name: str) -> None:
    """Take a framework added by `add_framework` out of the vocabulary again (the stock ones stay)."""
    if name in _added_frameworks:
        _added_frameworks.remove(name)


def spec_frameworks() -> tuple[str, ...]:
    """What a spec's source may name: every framework known now, and "spec"."""
    return (*FRAMEWORKS, *_added_frameworks, "spec")


def registered(stock: tuple[str, ...], known: Callable[[], Collection[str]]):
    """A str field that takes any name `known()` answers when a value is validated (a kind or a framework registered
    at run time too), shown in the JSON Schema as the enum of the `stock` names, as the Literal it replaces was."""

    def check(value: str) -> str:
        allowed = known()
        if value not in allowed:
            raise ValueError(f"Input should be {', '.join(repr(name) for name in allowed)}")
        return value

    return Annotated[str, AfterValidator(check), WithJsonSchema({"enum": list(stock), "type": "string"})]


#: A spec's source framework: one of FRAMEWORKS, a framework registered at run time, or "spec".
SpecFramework = registered((*FRAMEWORKS, "spec"), spec_frameworks)

DType = Literal["bfloat16", "float16", "float32", "float64"]
DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32", "float64")

#: Names of the state tensors a spec may carry.
TENSOR_NAMES: tuple[str, ...] = ("scale", "bias", "running_mean", "running_var", "num_batches_tracked")
