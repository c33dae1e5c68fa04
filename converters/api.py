"""The public conversion API: to_spec, from_spec, convert, last_report.

Every direction composes through the spec: convert(x, to) == from_spec(to_spec(x), to).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from schemas import ConversionReport, LayerReport, NormSpec, NotExpressibleError, SpecError

from .adapter import KindAdapter
from .options import ConversionOptions
from .adapters import REGISTRY, AdapterRegistry
from .expressing import stock_spec
from .model_values import NormLayerRef

_last = threading.local()


def _options(options: ConversionOptions | None, opset: int | None, overrides: dict) -> ConversionOptions:
    base = options or ConversionOptions()
    changes = dict(overrides)
    if opset is not None:
        changes["opset"] = opset
    return base.model_copy(update=changes) if changes else base


def _remember(report: ConversionReport) -> ConversionReport:
    _last.report = report
    return report


def last_report() -> ConversionReport | None:
    """The fidelity report of the last to_spec/from_spec/convert call in this thread."""
    return getattr(_last, "report", None)


def read_spec(
    obj: Any, report: LayerReport | None = None, registry: AdapterRegistry = REGISTRY
) -> tuple[NormSpec, LayerReport]:
    """to_spec plus the layer report it filled (used by convert and check)."""
    framework = registry.framework_of(obj)
    kind = framework.kind_of(obj)
    layer_report = report or LayerReport(
        layer="?", kind=kind, source_framework=framework.name, target_framework="spec", target_op="NormSpec"
    )
    spec = framework.recognised_spec(obj)
    if spec is None:
        spec = registry.get(framework.name, kind).to_spec(obj, layer_report)
    else:
        layer_report.add(
            "recognised",
            None,
            spec.source.layer_type,
            "translated",
            "read from what the module computes, proved on a probe",
        )
    layer_report.layer = spec.name
    return spec, layer_report


def layer_spec(ref: NormLayerRef, registry: AdapterRegistry = REGISTRY) -> NormSpec:
    """The spec of a layer walked in a model (ModelAdapter.norm_layers), named by its path in the model."""
    spec, _ = read_spec(ref.obj, registry=registry)
    return spec if spec.name == ref.path else spec.replace(name=ref.path)


def to_spec(obj: Any) -> NormSpec:
    """Read a torch.nn.Module, a Keras layer or an onnx.ModelProto holding one normalization layer."""
    spec, layer_report = read_spec(obj)
    _remember(ConversionReport(layers=[layer_report]))
    return spec


def write_spec(
    spec: NormSpec,
    to: str,
    options: ConversionOptions,
    report: LayerReport | None = None,
    registry: AdapterRegistry = REGISTRY,
    build: Callable[[KindAdapter, NormSpec, ConversionOptions, LayerReport], Any] | None = None,
) -> tuple[Any, LayerReport]:
    """from_spec plus its layer report.

    `build(adapter, spec, options, report)` stands in for `adapter.from_spec(spec, options, report)` on the spec it
    would get: check_many (converters/gate/grouped_check.py) passes one that builds a layer once per configuration and
    gives it each state.
    """
    layer_report = report or LayerReport(
        layer=spec.name, kind=spec.kind, source_framework=spec.source.framework, target_framework=to, target_op="?"
    )
    layer_report.target_framework = to
    adapter = registry.get(to, spec.kind, spec.name)
    restored = restored_layer(spec, to, options, layer_report, registry)
    if restored is not None:
        return restored, layer_report
    spec = stock_spec(
        spec, adapter.holds, layer_report
    )  # what a stock layer computes of settings it has no attribute for
    refuse_unheld_settings(spec, adapter)
    obj = (build or _from_spec)(adapter, with_input_rank(spec, options), options, layer_report)
    return obj, layer_report


def _from_spec(adapter: KindAdapter, spec: NormSpec, options: ConversionOptions, report: LayerReport) -> Any:
    return adapter.from_spec(spec, options, report)


def restored_layer(
    spec: NormSpec, to: str, options: ConversionOptions, report: LayerReport, registry: AdapterRegistry = REGISTRY
) -> Any:
    """The class `spec` was read from, when converting back to its framework can rebuild it
    (options.restore_source_class), else None; either way `report` says which class the layer becomes and why."""
    if spec.source.framework != to or not spec.source.module_class:
        return None
    if not options.restore_source_class:
        report.add(
            "class", spec.source.module_class, None, "dropped", "restore_source_class=False: the stock class is built"
        )
        return None
    layer, how = registry.framework(to).restore(with_input_rank(spec, options))
    if layer is None:
        report.add("class", spec.source.module_class, None, "dropped", f"the stock class is built: {how}")
        return None
    report.target_op = type(layer).__name__
    report.add("class", spec.source.module_class, spec.source.module_class, "exact", how)
    return layer


def target_spec_of(spec: NormSpec, to: str, registry: AdapterRegistry = REGISTRY) -> NormSpec:
    """The spec `write_spec(spec, to)` builds its layer for: `spec` with what the target holds no attribute for
    expressed in what it does (expressing.stock_spec). A layer read back from the target should equal it."""
    return stock_spec(spec, registry.get(to, spec.kind, spec.name).holds)


def with_input_rank(spec: NormSpec, options: ConversionOptions) -> NormSpec:
    """`spec` with the input rank the conversion asks for (options.input_rank), which every adapter then builds for."""
    if options.input_rank is None or options.input_rank == spec.input_rank:
        return spec
    try:
        return spec.replace(input_rank=options.input_rank)
    except SpecError as error:
        raise SpecError(
            f"input_rank={options.input_rank} was asked for, but {error.message}", layer=spec.name, setting="input_rank"
        ) from error


def refuse_unheld_settings(spec: NormSpec, adapter) -> None:
    """NotExpressibleError for the first extended setting of `spec` the target adapter does not hold."""
    for setting, value in spec.extended_settings().items():
        if setting not in adapter.holds:
            raise NotExpressibleError(
                f"no stock {adapter.framework} {adapter.kind} normalization holds {setting}={value!r}; keep the layer in its source "
                "framework or convert a spec without it.",
                layer=spec.name,
                setting=setting,
                target=adapter.framework,
            )


def from_spec(
    spec: NormSpec,
    to: str,
    *,
    opset: int | None = None,
    options: ConversionOptions | None = None,
    **option_overrides: Any,
) -> Any:
    """Build the target framework's natural layer: "torch" -> nn.Module, "keras" -> built layer,
    "onnx" -> ModelProto."""
    obj, layer_report = write_spec(spec, to, _options(options, opset, option_overrides))
    _remember(ConversionReport(layers=[layer_report]))
    return obj


def convert_with_report(
    obj: Any, to: str, *, opset: int | None = None, options: ConversionOptions | None = None, **option_overrides: Any
) -> tuple[Any, ConversionReport]:
    """convert() returning the fidelity report alongside the converted object."""
    spec, layer_report = read_spec(obj)
    target, layer_report = write_spec(spec, to, _options(options, opset, option_overrides), layer_report)
    return target, _remember(ConversionReport(layers=[layer_report]))


def convert(
    obj: Any, to: str, *, opset: int | None = None, options: ConversionOptions | None = None, **option_overrides: Any
) -> Any:
    """Convert one normalization layer to framework `to`; the report is in last_report()."""
    return convert_with_report(obj, to, opset=opset, options=options, **option_overrides)[0]
