"""`GroupObjects`: how `check_many` (grouped_check.py) makes and runs the objects of many layers of one configuration.

Why a module of its own: the grouping (which layers share a configuration, in which order their checks run, what a
member whose check raises gets) is grouped_check.py's; making the objects once per configuration and running them
together is this module's, and `check_target` (converters/equivalence.py) calls it where `check` would build and run its
own objects:

- Keras: a kind adapter that declares `restatable` builds its layer from the configuration and writes the
  tensors in one place (keras_adapter/kind_adapter.py); the group's first layer is built by from_spec, later
  ones are that layer given their name and tensors (`restate`, every variable written bit-exactly), and the
  training step runs on it (the next `restate` writes every variable it moved). An adapter that does not
  declare it (a subclass overriding from_spec) builds every layer with from_spec. A layer serving at least
  KEEP_RUNS_FROM members is written and run through the framework's kept runs (Keras: tf.functions traced
  once, bit for bit its eager calls: keras_adapter/traced.py).
- ONNX: every member's model is written by from_spec as `check` writes it, then all are run in one session over
  one graph holding each model as written (onnx_adapter/merged_runs.py).
- torch: modules are built by from_spec per member (cheap) and run without a defensive copy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas import LayerReport, NormSpec, NotExpressibleError

from ..adapter import KindAdapter
from ..adapters import AdapterRegistry
from ..api import write_spec
from ..equivalence import CheckObjects
from ..options import ConversionOptions


def configuration(spec: NormSpec) -> str:
    """Everything a converter builds a layer from except the name and the tensors' values: kind, shapes, dtype, layout,
    flags, eps, momentum, provenance, the tensors' names, dtypes and shapes, and num_batches_tracked's value (a
    momentum=None layer's emitted momentum and Keras's remembered counter depend on it)."""
    fields = spec.model_dump(
        exclude={"name", "tensors"}
    )  # in the model's field order: its repr is the same for equal fields
    tensors = sorted((name, array.dtype.str, array.shape) for name, array in spec.tensors.items())
    counter = spec.tensors.get("num_batches_tracked")
    return repr((fields, tensors, None if counter is None else int(counter)))


@dataclass
class _Template:
    """A layer from_spec built, and what from_spec gave it that `restate` cannot: its state then, its warnings,
    its op."""

    layer: Any
    state: Any
    warnings: list[str]
    target_op: str
    native: bool
    uses: int = 0  # members built on it so far
    runs: Any = None  # framework.kept_runs(layer), asked for once the layer serves enough members (`_keep_runs`)
    asked: bool = False
    probe: Any = (
        None  # the input its last eval and step ran on, given to the next write where the runs take it (`_kept_run`)
    )


def restatable(adapter: KindAdapter) -> bool:
    """Whether the class defining the adapter's from_spec declares that `restate` may stand in for it."""
    return _restatable(type(adapter))


@functools.lru_cache(maxsize=None)
def _restatable(cls: type) -> bool:
    owner = next(base for base in cls.__mro__ if "from_spec" in vars(base))
    return vars(owner).get("restatable") is True and hasattr(cls, "restate")


#: Members of one configuration from which a layer is run by the framework's kept runs (GroupObjects._keep_runs).
KEEP_RUNS_FROM = 8


class GroupObjects(CheckObjects):
    """The objects of one group's checks: Keras layers restated per configuration,
    ONNX models run in one session each way."""

    def __init__(self, registry: AdapterRegistry):
        super().__init__(registry)
        self._templates: dict[tuple, _Template] = {}
        self._kept: dict[int, _Template] = {}  # id(template layer) -> its template
        self._group = 1  # members in the group being checked (write_ahead)
        self._ahead: dict[int, tuple[ConversionOptions, Any]] = {}  # id(spec) -> (options, (obj, report) or the error)
        self._runs: dict[tuple[bool, int], Any] = {}  # (train, id(obj)) -> the value run_eval/run_train_step returns
        self._merged: dict[bool, bytes | None] = {}  # train -> the input the merged run was made with (None: not made)
        self._trains: dict[
            int, bool
        ] = {}  # id(layer written for a target) -> whether its check asks for a training step
        self._stepped: dict[
            int, tuple[bytes, Any]
        ] = {}  # id(layer) -> (input, training step) run with its eval (`_eval`)
        self._configurations: dict[
            int, tuple[NormSpec, str]
        ] = {}  # id(spec) -> (spec, its configuration) of the group's members

    def forget_beyond(self, count: int) -> None:
        """Keep only the `count` most recently built templates (a long-lived worker meets ever new configurations)."""
        while len(self._templates) > count:
            oldest = self._templates.pop(next(iter(self._templates)))  # the oldest first
            self._kept.pop(id(oldest.layer), None)

    def release(self, keep: int) -> None:
        """End a call: drop the last group's written models and runs, keep at most `keep` configurations' templates."""
        self._forget_runs()
        self._configurations.clear()
        self._group = 1
        self.forget_beyond(keep)

    def members(self, specs: list[NormSpec], configuration_of_all: str) -> None:
        """The group about to be checked: these specs, all of `configuration_of_all` (grouped_check.groups computed it),
        which each target's write of them then looks up instead of computing it again. Only these objects: any other
        spec written (a layer read back from a target, a spec a conversion changed) has its configuration computed."""
        self._configurations = {id(spec): (spec, configuration_of_all) for spec in specs}

    def _configuration(self, spec: NormSpec) -> str:
        held = self._configurations.get(id(spec))
        return held[1] if held is not None and held[0] is spec else configuration(spec)

    def _forget_runs(self) -> None:
        """Drop what one target's checks of a group wrote ahead and ran (each target's start here: nothing grows across
        targets)."""
        for held in (self._ahead, self._runs, self._merged, self._trains, self._stepped):
            held.clear()

    # -- writing -------------------------------------------------------------------------

    def _builder(self, role: str, to: str, options: ConversionOptions):
        def build(adapter: KindAdapter, spec: NormSpec, build_options: ConversionOptions, report: LayerReport) -> Any:
            if not restatable(adapter):
                return adapter.from_spec(spec, build_options, report)
            key = (
                role,
                to,
                type(adapter),
                build_options,
                self._configuration(spec),
            )  # options are frozen, hashed by value
            template = self._templates.get(key)
            if template is None:
                before = len(report.warnings)
                layer = adapter.from_spec(spec, build_options, report)
                template = self._templates[key] = _Template(
                    layer, adapter.template_state(layer), report.warnings[before:], report.target_op, report.native
                )
                self._kept[id(layer)] = template
                self._keep_runs(template, to)
                return layer
            self._keep_runs(template, to)  # before restate: a layer run by its kept runs is written by them too
            # A target's check runs the eval and the step next on the group's probe: where the runs can,
            # the write runs them too.
            ahead = (
                template.runs.run_with_next_write
                if template.runs is not None and role == "target" and spec.track_running_stats
                else None
            )
            try:
                if ahead is not None:
                    ahead(template.probe)
                adapter.restate(template.layer, spec, template.state)
            # from_spec meets the same problem and says it in its own words (a layer of this name)
            except Exception:  # noqa: BLE001
                return adapter.from_spec(spec, build_options, report)
            finally:
                if ahead is not None:
                    ahead(None)  # a restate that wrote nothing leaves no input for a later write
            for warning in template.warnings:
                report.warn(warning)
            report.target_op, report.native = template.target_op, template.native
            return template.layer

        return build

    def _keep_runs(self, template: _Template, to: str) -> None:
        """Count a member built on `template`; once it serves KEEP_RUNS_FROM members (counted so far, or in the group
        being checked), ask the framework for runs kept with the layer (Keras: traced,
        converters/keras_adapter/traced.py). Fewer members would not pay back the trace: about 45 ms per configuration
        against about 4 ms saved per member."""
        template.uses += 1
        if not template.asked and max(template.uses, self._group) >= KEEP_RUNS_FROM:
            template.asked = True
            template.runs = self.registry.framework(to).kept_runs(template.layer)

    def write_ahead(self, target: str, specs: list[NormSpec], options: ConversionOptions) -> None:
        """ONNX: write every member's model now, so one merged session runs them all when the first is run."""
        self._forget_runs()
        self._group = len(specs)
        if target != "onnx" or len(specs) < 2:
            return
        for spec in specs:
            try:
                self._ahead[id(spec)] = (options, write_spec(spec, target, options, registry=self.registry))
            except Exception as error:  # raised again where check meets it
                self._ahead[id(spec)] = (options, error)

    def write(self, spec: NormSpec, target: str, options: ConversionOptions) -> tuple[Any, Any]:
        self._stepped.clear()  # a layer written since its eval holds another state
        ahead = self._ahead.get(id(spec))
        if ahead is not None and ahead[0] == options:
            if isinstance(ahead[1], Exception):
                raise ahead[1]
            return ahead[1]
        written = write_spec(
            spec, target, options, registry=self.registry, build=self._builder("target", target, options)
        )
        self._trains[id(written[0])] = (
            spec.track_running_stats
        )  # check_target's training step follows the eval of these
        return written

    def write_back(self, spec: NormSpec, source: str, options: ConversionOptions) -> Any:
        self._stepped.clear()
        return write_spec(spec, source, options, registry=self.registry, build=self._builder("back", source, options))[
            0
        ]

    # -- running -------------------------------------------------------------------------

    def run_eval(self, framework, obj: Any, x: np.ndarray) -> np.ndarray:
        return self._run(framework, obj, x, train=False)

    def run_train_step(self, framework, obj: Any, x: np.ndarray):
        return self._run(framework, obj, x, train=True)

    def _run(self, framework, obj: Any, x: np.ndarray, train: bool) -> Any:
        if framework.name == "onnx" and self._ahead:
            self._run_merged(framework, x, train)
            if (train, id(obj)) in self._runs and self._merged.get(train) == _fingerprint(x):
                return self._runs[(train, id(obj))]
        template = self._kept.get(id(obj))
        if template is not None and template.layer is obj and template.runs is not None:
            if template.probe is not None or not self._trains.get(id(obj)):
                return self._kept_run(template, x, train)
            # The first eval and step since the runs were asked run as written here: they give the probe, and every
            # later member's write carries its own (one trace per configuration, of the write with them).
            template.probe = x if train else None
        run = framework.run_train_step if train else framework.run_eval
        return run(
            obj, x, in_place=True
        )  # every object here is this set's own: a torch module per member, a restated Keras layer

    def _kept_run(self, template: _Template, x: np.ndarray, train: bool) -> Any:
        """A run through the layer's kept runs. An eval whose check asks for a training step next runs both in one call
        where the runs can (`run_eval_and_train_step`; a step it refuses is refused before anything runs, then asked for
        alone), and the step is handed over when asked for on the same input with no write between. Any other run of a
        layer whose step has run is not the one check makes: it raises, and the member is checked by `check` itself."""
        runs, obj = template.runs, template.layer
        held = self._stepped.pop(id(obj), None)
        if held is not None:
            if train and held[0] == _fingerprint(x):
                return held[1]
            raise RuntimeError("the layer was stepped with its eval; this run would see the moved statistics")
        if train:
            return runs.run_train_step(x)
        if not self._trains.get(id(obj)):
            return runs.run_eval(x)
        template.probe = x
        try:
            out, step = runs.run_eval_and_train_step(x)
        except NotExpressibleError:
            return runs.run_eval(x)
        self._stepped[id(obj)] = (_fingerprint(x), step)
        return out

    def _run_merged(self, framework, x: np.ndarray, train: bool) -> None:
        """Run every model written ahead in one session (once per mode); a model whose run cannot be planned, or a
        merged run that fails, leaves its members to run on their own (where each raises its own error)."""
        from ..onnx_adapter.merged_runs import mergeable, run_merged

        if train in self._merged:
            return
        self._merged[train] = None
        objects, runs = [], []
        for _, written in self._ahead.values():
            if isinstance(written, Exception):
                continue
            try:
                runs.append(framework.train_run(written[0]) if train else framework.eval_run(written[0]))
                objects.append(written[0])
            except Exception:  # raised again when this member runs on its own
                continue
        if len(runs) < 2 or not mergeable(runs):
            return
        try:
            values = run_merged(runs, x)
        except Exception:  # each member runs on its own and meets its own error
            return
        self._runs.update(((train, id(obj)), value) for obj, value in zip(objects, values))
        self._merged[train] = _fingerprint(x)


def _fingerprint(x: np.ndarray) -> bytes:
    return repr((x.dtype.str, x.shape)).encode() + np.ascontiguousarray(x).tobytes()


__all__ = ["GroupObjects", "KEEP_RUNS_FROM", "configuration", "restatable"]
