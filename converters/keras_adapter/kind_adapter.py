"""`KerasKindAdapter`: the steps every Keras kind adapter shares (class check, the start and the end of from_spec)."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from schemas import LayerReport, NormSpec, SpecError, UnsupportedObjectError

from .. import markers
from ..adapter import KindAdapter
from ..translate import record_eps, tensor_fate
from .deferred import defer_build
from .facts import MODE_NOTE, STORED_NOTE
from .runtime import keras_class
from .traced import kept_calls
from .variables import assign_variable, check_spec_dtype, read_variable, variable_dtype, write_variable

#: Where finish_emit leaves which variable holds which spec tensor (spec tensor -> attribute), for `restate`.
STATE_SLOTS = "_normbridge_state_slots"


def keras_name(spec: NormSpec, report: LayerReport) -> str:
    """spec.name as a legal Keras name; the original is remembered when it had to change."""
    # Keras rejects "/" in names (keras/src/ops/operation.py); ONNX node names often hold it.
    name = spec.name.replace("/", "_")
    if name != spec.name:
        report.add("name", spec.name, name, "stored", "Keras names cannot hold '/'; the original is " + STORED_NOTE)
    return name


class KerasKindAdapter(KindAdapter):
    """Shared steps of the Keras kind adapters: class checks, the start and the end of from_spec."""

    framework: ClassVar[str] = "keras"
    #: Every Keras layer holds bfloat16 and, under a mixed policy, float32 statistics of a bf16/fp16 layer, with its
    #: state in the float32 variables (state_dtype float32) or as exact bf16/fp16 values in them.
    holds: ClassVar[frozenset[str]] = frozenset({"dtype", "compute_dtype", "state_dtype"})
    #: Names in keras.layers this adapter reads.
    layer_classes: ClassVar[tuple[str, ...]]
    #: Declared by a class whose from_spec builds from the configuration alone and writes the spec's tensors only in
    #: finish_emit, so `restate` may stand in for it (converters/gate/group_objects.py). Read from the class that
    #: defines from_spec: a subclass overriding from_spec without declaring it again is never restated.
    restatable: ClassVar[bool] = False

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
            raise SpecError(
                f"the Keras {self.kind} adapter got a {spec.kind} spec; use the adapter for kind '{spec.kind}'.",
                layer=spec.name,
                setting="kind",
            )
        dtype = check_spec_dtype(spec)
        if spec.compute_dtype is None:
            report.add("dtype", dtype)
        else:
            state = spec.state_dtype or spec.dtype
            report.add(
                "compute_dtype",
                spec.compute_dtype,
                dtype,
                "translated",
                f"dtype policy {dtype}: float32 variables holding the {state} state exactly",
            )
        return {"name": keras_name(spec, report), "dtype": dtype, "epsilon": record_eps(report, spec)}

    def finish_emit(
        self, layer: Any, spec: NormSpec, report: LayerReport, input_shape: tuple | None, variables: Mapping[str, str]
    ) -> Any:
        """Build, copy the tensors bit-exactly, remember what Keras cannot hold, fill the report.

        `input_shape` None leaves the layer unbuilt: its first call builds it with the tensors (deferred.py)."""
        if input_shape is None:
            defer_build(layer, spec, variables, report)
        else:
            layer.build(input_shape)
            slots = {
                tensor_name: attribute for tensor_name, attribute in variables.items() if tensor_name in spec.tensors
            }
            object.__setattr__(layer, STATE_SLOTS, slots)
            write_state(layer, spec, slots)
        tensor_fate(report, spec)
        report.add("training", spec.training, spec.training, "stored", MODE_NOTE)
        fields: dict[str, Any] = {"training": spec.training}
        if spec.eps_origin != "explicit":
            report.add(
                "eps_origin",
                spec.eps_origin,
                spec.eps_origin,
                "stored",
                "Keras holds the number only; the origin is " + STORED_NOTE,
            )
            fields["eps_origin"] = spec.eps_origin
        if layer.name != spec.name:
            fields["name"] = spec.name
        markers.remember(layer, **fields)
        report.target_op = type(layer).__name__
        report.native = True
        return layer

    def template_state(self, layer: Any) -> list[np.ndarray]:
        """Every variable's value as from_spec left `layer`: what `restate` gives back to the variables no tensor is
        written to."""
        return [read_variable(variable) for variable in layer.weights]

    def restate(self, layer: Any, spec: NormSpec, template: Sequence[np.ndarray]) -> None:
        """Make `layer` what this adapter's from_spec builds for `spec`, without building: `layer` was built by
        from_spec for a spec of the same configuration (everything but the name and the tensors' values), and `template`
        holds the values its variables had then.

        from_spec(spec) would build the same class with the same configuration, name it after `spec` and write `spec`'s
        tensors in finish_emit; every other variable keeps what the configuration gave it, which `template` holds (a
        training step since may have moved them). A layer left unbuilt for its first call (deferred.py) holds no
        variables to write: it is refused before anything changes, and the caller builds that member with from_spec.
        """
        if not hasattr(layer, STATE_SLOTS):
            raise ValueError(f"the Keras layer '{layer.name}' is built on its first call; it is rebuilt, not restated")
        layer.name = keras_name(
            spec,
            LayerReport(
                layer=spec.name, kind=spec.kind, source_framework="spec", target_framework="keras", target_op="?"
            ),
        )
        extras = markers.recall(layer)
        extras.pop("name", None)
        if layer.name != spec.name:
            extras["name"] = spec.name
        markers.replace(layer, extras)
        slots = {
            tensor_name: getattr(layer, attribute, None)
            for tensor_name, attribute in getattr(layer, STATE_SLOTS).items()
        }
        if any(variable is None for variable in slots.values()):
            raise ValueError(
                f"the Keras layer '{layer.name}' lacks a variable its tensors were written to; it is rebuilt, not restated"
            )
        held = {id(variable): tensor_name for tensor_name, variable in slots.items()}
        dtype = variable_dtype(spec)
        # The spec's tensors where from_spec's write_state writes them, the template's values elsewhere, each verified
        # to read back bit-identically: in one traced call when the layer is run traced (traced.py),
        # else one variable at a time.
        values = [
            spec.tensors[held[id(variable)]].astype(dtype) if id(variable) in held else value
            for variable, value in zip(layer.weights, template)
        ]
        calls = kept_calls(layer)
        if calls is not None:
            calls.write(values)
            return
        for variable, value in zip(layer.weights, values):
            write_variable(
                variable, value, layer=layer.name, setting=held.get(id(variable)) or variable.path.rsplit("/", 1)[-1]
            )


def write_state(layer: Any, spec: NormSpec, slots: Mapping[str, str]) -> None:
    """Write the spec's tensors into the variables `slots` names (spec tensor -> attribute), bit-exactly."""
    for tensor_name, attribute in slots.items():
        assign_variable(layer, attribute, spec.tensors[tensor_name].astype(variable_dtype(spec)), tensor_name)
