"""Helpers every Keras kind adapter shares: importing Keras, dtypes, bit-exact variables, shapes, markers.

Keras keeps some settings only implicitly (the input rank in the build config, the mode
in each call's `training=`), and cannot hold others at all (num_batches_tracked, a
momentum in PyTorch's convention). Reading and writing those in one place keeps the five
kind adapters from drifting apart.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Mapping

import numpy as np
import pydantic

from schemas import LayerReport, NormSpec, SpecError, Source, UnsupportedObjectError
from schemas.tensors import tensors_identical
from schemas.vocabulary import DTYPES

from .. import markers
from ..adapter import KindAdapter
from ..translate import record_eps, tensor_fate

#: Keras reads momentum as the weight of the running value: moving = m * moving + (1 - m) * batch.
RUNNING_WEIGHT = "running_weight"

#: Spec tensor -> Keras attribute, for layers whose affine weights are gamma/beta.
AFFINE_VARIABLES: dict[str, str] = {"scale": "gamma", "bias": "beta"}

STORED_NOTE = "kept on the in-memory layer only (normbridge marker)"
MODE_NOTE = "Keras has no per-layer mode; call it with training=...; " + STORED_NOTE


def import_keras():
    """Import Keras on the TensorFlow backend (unless the user chose another) with TF's logs quiet."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    return keras


def keras_class(name: str) -> type:
    """`keras.layers.<name>`."""
    return getattr(import_keras().layers, name)


def source(layer: Any) -> Source:
    return Source(framework="keras", framework_version=import_keras().__version__, layer_type=type(layer).__name__)


# -- names ---------------------------------------------------------------------------


def keras_name(spec: NormSpec, report: LayerReport) -> str:
    """spec.name as a legal Keras name; the original is remembered when it had to change."""
    # Keras rejects "/" in names (keras/src/ops/operation.py); ONNX node names often hold it.
    name = spec.name.replace("/", "_")
    if name != spec.name:
        report.add("name", spec.name, name, "stored", "Keras names cannot hold '/'; the original is " + STORED_NOTE)
    return name


def spec_name(layer: Any, report: LayerReport) -> str:
    """The layer's name, or the remembered original when it sanitises to it."""
    remembered = markers.recall(layer).get("name")
    if remembered is None:
        return layer.name
    if isinstance(remembered, str) and remembered and remembered.replace("/", "_") == layer.name:
        return remembered
    report.warn(f"the remembered name {remembered!r} does not match the layer's name {layer.name!r}; using the layer's name.")
    return layer.name


# -- dtypes --------------------------------------------------------------------------


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


# -- variables -----------------------------------------------------------------------


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


# -- shapes and axes -----------------------------------------------------------------


def built_input_shape(layer: Any) -> tuple[int | None, ...]:
    """The input shape the layer was built for; SpecError when it is not built."""
    if not layer.built:
        raise SpecError(
            f"the {type(layer).__name__} is not built, so its input rank and weights do not exist yet; call it on an input or build(input_shape) first.",
            layer=layer.name,
            setting="input_shape",
        )
    shape = (layer.get_build_config() or {}).get("input_shape")
    if not isinstance(shape, (tuple, list)) or not all(d is None or isinstance(d, numbers.Integral) for d in shape):
        raise SpecError(
            f"the {type(layer).__name__} is built but records no single input shape (got {shape!r}); build it with build(input_shape).",
            layer=layer.name,
            setting="input_shape",
        )
    return tuple(None if d is None else int(d) for d in shape)


def channel_layout(layer: Any, axis: Any, rank: int) -> str:
    """channels_last for axis -1, channels_first for axis 1; anything else is not a per-channel normalizer."""
    if isinstance(axis, numbers.Integral) and not isinstance(axis, bool):
        if axis in (-1, rank - 1):  # checked first: for rank 2 both layouts are the same
            return "channels_last"
        if axis in (1, 1 - rank):
            return "channels_first"
    raise UnsupportedObjectError(
        f"the {type(layer).__name__} normalises axis {axis!r} of a rank-{rank} input, expected the channel axis -1 (channels_last) or 1 (channels_first); "
        "rebuild it with one of those.",
        layer=layer.name,
        setting="axis",
    )


def trailing_axes(layer: Any, axis: Any, rank: int) -> tuple[int, ...]:
    """The normalised axes as negative indices; UnsupportedObjectError unless they are the trailing ones."""
    axes = [axis] if isinstance(axis, numbers.Integral) else list(axis)
    negative = sorted(int(a) - rank if int(a) >= 0 else int(a) for a in axes)
    if not negative or negative != list(range(-len(negative), 0)):
        raise UnsupportedObjectError(
            f"the {type(layer).__name__} normalises axes {axis!r} of a rank-{rank} input, expected the trailing contiguous axes (e.g. [-2, -1]); "
            "PyTorch and ONNX normalise trailing axes only, so transpose the input first.",
            layer=layer.name,
            setting="axis",
        )
    return tuple(negative)


def trailing_axis_argument(count: int) -> int | list[int]:
    """Keras `axis=` for the last `count` axes: -1, or [-count, ..., -1]."""
    return -1 if count == 1 else list(range(-count, 0))


def channels_last_shape(num_features: int, rank: int) -> tuple[int | None, ...]:
    return (None,) * (rank - 1) + (num_features,)


def trailing_shape(normalized_shape: tuple[int, ...], rank: int) -> tuple[int | None, ...]:
    return (None,) * (rank - len(normalized_shape)) + tuple(normalized_shape)


def build_rank(spec: NormSpec, report: LayerReport, default: int, minimum: int = 2) -> int:
    """spec.input_rank, or `default` (reported) when the source did not record a batched rank."""
    if spec.input_rank is not None and spec.input_rank >= minimum:
        return spec.input_rank
    reason = "not recorded by the source" if spec.input_rank is None else f"rank {spec.input_rank} has no batch axis here"
    report.add("input_rank", spec.input_rank, default, "translated", f"{reason}; the Keras layer is built for rank-{default} inputs")
    return default


def spatial_rank_of(layer: Any, rank: int, min_rank: int) -> int:
    """Spatial axes of a channel kind: 1 to 3, as PyTorch's 1d/2d/3d (a rank-2 BatchNorm input counts as 1d)."""
    if not min_rank <= rank <= 5:
        raise UnsupportedObjectError(
            f"the {type(layer).__name__} was built for a rank-{rank} input, expected rank {min_rank} to 5 (batch, channels and up to 3 spatial axes).",
            layer=layer.name,
            setting="input_rank",
        )
    return max(rank - 2, 1)


# -- GroupNormalization: group or instance -------------------------------------------


def group_norm_channels(layer: Any) -> tuple[tuple[int | None, ...], str, int]:
    """(built input shape, layout, channels) of a GroupNormalization."""
    shape = built_input_shape(layer)
    layout = channel_layout(layer, layer.axis, len(shape))
    return shape, layout, int(shape[layer.axis])


def group_layer_kind(layer: Any) -> str:
    """instance or group, the rule kind_of and the adapters share.

    build() overwrites groups=-1 with the channel count (keras/src/layers/normalization/
    group_normalization.py), so one group per channel reads as InstanceNorm unless the
    layer was emitted from a group spec (marker kind="group"). A rank-2 input has no
    spatial axes, so it stays a GroupNorm.
    """
    if not layer.built:
        return "instance" if layer.groups == -1 else "group"
    shape = built_input_shape(layer)
    if layer.groups != shape[layer.axis] or len(shape) < 3:
        return "group"
    return "group" if markers.recall(layer).get("kind") == "group" else "instance"


def read_group_layer(layer: Any, report: LayerReport, kind: str, **fields: Any) -> NormSpec:
    """The spec of a GroupNormalization read as `kind` ("group" or "instance"), refusing the other reading."""
    shape, layout, channels = group_norm_channels(layer)
    found = group_layer_kind(layer)
    if found != kind:
        raise UnsupportedObjectError(
            f"the GroupNormalization has {layer.groups} groups for {channels} channels on a rank-{len(shape)} input, which reads as kind "
            f"'{found}', expected kind '{kind}'; convert it through converters.to_spec().",
            layer=layer.name, setting="groups",
        )
    if kind == "group":
        fields["num_groups"] = int(layer.groups)
    else:
        fields.update(spatial_rank=spatial_rank_of(layer, len(shape), 3), track_running_stats=False)
    return read_facts(layer, report).spec(
        layer, kind, read_variables(layer, AFFINE_VARIABLES),
        num_features=channels, input_rank=len(shape), layout=layout, scale=bool(layer.scale), bias=bool(layer.center), **fields,
    )


# -- markers -------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerFacts:
    """What every kind reads the same way: name, dtype, eps and the remembered mode."""

    name: str
    dtype: str
    eps: float
    eps_origin: str
    training: bool

    def spec(self, layer: Any, kind: str, tensors: dict[str, np.ndarray], **fields: Any) -> NormSpec:
        """The validated spec; a framework state pydantic rejects becomes a SpecError naming the layer."""
        try:
            return NormSpec(
                name=self.name, kind=kind, eps=self.eps, eps_origin=self.eps_origin, training=self.training,
                dtype=self.dtype, source=source(layer), tensors=tensors, **fields,
            )
        except pydantic.ValidationError as error:
            first = error.errors()[0]
            setting = ".".join(str(p) for p in first["loc"]) or None
            raise SpecError(f"the layer's settings do not form a valid {kind} spec ({first['msg']}); fix the layer's configuration.", layer=layer.name, setting=setting) from None


def read_facts(layer: Any, report: LayerReport) -> LayerFacts:
    """Name, dtype, eps and the remembered training flag and eps origin (trusted only when they agree)."""
    dtype = layer_dtype(layer)
    eps = layer.epsilon
    if eps is None:
        # ops.layer_normalization / rms_normalization fall back to keras.config.epsilon().
        eps = import_keras().config.epsilon()
        report.warn(f"epsilon=None: Keras uses keras.config.epsilon() = {eps!r}; the spec records that number.")
    eps = float(eps)
    remembered = markers.recall(layer)
    training = remembered.get("training", False)
    if not isinstance(training, bool):
        report.warn(f"the remembered training flag {training!r} is not a bool; reading the layer as in inference mode.")
        training = False
    eps_origin = remembered.get("eps_origin", "explicit")
    if eps_origin == "dtype_eps" and eps != float(np.finfo(dtype).eps):
        report.warn(f"eps was emitted as finfo({dtype}).eps but is now {eps!r}; it is read as an explicit eps.")
        eps_origin = "explicit"
    elif eps_origin not in ("explicit", "dtype_eps"):
        report.warn(f"the remembered eps origin {eps_origin!r} is unknown; it is read as an explicit eps.")
        eps_origin = "explicit"
    return LayerFacts(name=spec_name(layer, report), dtype=dtype, eps=eps, eps_origin=eps_origin, training=training)


def without_training(facts: LayerFacts) -> LayerFacts:
    return replace(facts, training=False)


def recall_running(layer: Any, report: LayerReport, layer_momentum: float) -> dict[str, Any]:
    """momentum, momentum_convention and the num_batches_tracked tensor, from the marker when it agrees.

    The remembered momentum (as given, in its own convention) is used only if it was
    emitted as the value the layer still holds; otherwise the layer's wins.
    """
    remembered = markers.recall(layer)
    fields: dict[str, Any] = {"momentum": layer_momentum, "momentum_convention": RUNNING_WEIGHT}
    tensors: dict[str, np.ndarray] = {}
    count = remembered.get("num_batches_tracked")
    if count is not None:
        if isinstance(count, numbers.Integral) and not isinstance(count, bool) and count >= 0:
            tensors["num_batches_tracked"] = np.array(int(count), dtype=np.int64)
        else:
            report.warn(f"the remembered num_batches_tracked {count!r} is not a non-negative integer; it is dropped.")
    if "momentum_emitted" in remembered:
        value, convention = remembered.get("momentum"), remembered.get("momentum_convention")
        emitted = remembered["momentum_emitted"]
        valid = (value is None and convention is None and "num_batches_tracked" in tensors) or (
            isinstance(value, float) and convention in ("batch_weight", RUNNING_WEIGHT)
        )
        if valid and emitted == layer_momentum:
            fields = {"momentum": value, "momentum_convention": convention}
        else:
            report.warn(
                f"the remembered momentum {value!r} ({convention}) was emitted as {emitted!r} but the layer now holds {layer_momentum!r}; using the layer's value."
            )
    return {**fields, "tensors": tensors}


def remember_running(layer: Any, spec: NormSpec, report: LayerReport, emitted: float) -> None:
    """Keep the momentum as given (with its convention) and num_batches_tracked, which Keras cannot hold."""
    fields: dict[str, Any] = {"momentum": spec.momentum, "momentum_convention": spec.momentum_convention, "momentum_emitted": emitted}
    if "num_batches_tracked" in spec.tensors:
        count = int(spec.tensors["num_batches_tracked"])
        fields["num_batches_tracked"] = count
        report.add("num_batches_tracked", count, count, "stored", STORED_NOTE + "; dropped from .keras files")
    if spec.momentum_convention != RUNNING_WEIGHT:
        given = f"{spec.momentum!r} ({spec.momentum_convention})" if spec.momentum is not None else "None (cumulative average)"
        report.add("momentum_convention", spec.momentum_convention, RUNNING_WEIGHT, "stored", f"the momentum as given, {given}, is " + STORED_NOTE)
    markers.remember(layer, **fields)


# -- the base adapter ----------------------------------------------------------------


class KerasKindAdapter(KindAdapter):
    """Shared steps of the Keras kind adapters: class checks, the start and the end of from_spec."""

    framework: ClassVar[str] = "keras"
    #: Names in keras.layers this adapter reads.
    layer_classes: ClassVar[tuple[str, ...]]

    def layer_of(self, obj: Any) -> Any:
        """`obj` if it is one of this adapter's Keras classes."""
        classes = tuple(keras_class(name) for name in self.layer_classes)
        if not isinstance(obj, classes):
            wanted = " or ".join(f"keras.layers.{name}" for name in self.layer_classes)
            raise UnsupportedObjectError(
                f"the {self.kind} adapter got a {type(obj).__module__}.{type(obj).__qualname__}, expected a {wanted}; convert it through converters.to_spec().",
                layer=getattr(obj, "name", None),
            )
        return obj

    def begin_emit(self, spec: NormSpec, report: LayerReport) -> dict[str, Any]:
        """Constructor arguments every Keras normalization layer takes: name, dtype, epsilon."""
        if spec.kind != self.kind:
            raise SpecError(f"the Keras {self.kind} adapter got a {spec.kind} spec; use the adapter for kind '{spec.kind}'.", layer=spec.name, setting="kind")
        dtype = check_spec_dtype(spec)
        report.add("dtype", dtype)
        return {"name": keras_name(spec, report), "dtype": dtype, "epsilon": record_eps(report, spec)}

    def finish_emit(self, layer: Any, spec: NormSpec, report: LayerReport, input_shape: tuple, variables: Mapping[str, str]) -> Any:
        """Build, copy the tensors bit-exactly, remember what Keras cannot hold, fill the report."""
        layer.build(input_shape)
        for tensor_name, attribute in variables.items():
            if tensor_name in spec.tensors:
                assign_variable(layer, attribute, spec.tensors[tensor_name], tensor_name)
        tensor_fate(report, spec)
        report.add("training", spec.training, spec.training, "stored", MODE_NOTE)
        fields: dict[str, Any] = {"training": spec.training}
        if spec.eps_origin != "explicit":
            report.add("eps_origin", spec.eps_origin, spec.eps_origin, "stored", "Keras holds the number only; the origin is " + STORED_NOTE)
            fields["eps_origin"] = spec.eps_origin
        if layer.name != spec.name:
            fields["name"] = spec.name
        markers.remember(layer, **fields)
        report.target_op = type(layer).__name__
        report.native = True
        return layer
