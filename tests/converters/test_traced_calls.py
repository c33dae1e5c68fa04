"""A Keras layer's traced writes and calls (converters/keras_adapter/traced.py) are its eager ones, bit for bit.

check_many runs a layer serving many members of one configuration through tf.functions traced once (without grappler);
`check` calls it eagerly. On every case of the table Keras builds a layer for, after the layer is given a second
member's state: the written variables, the eval output, the training output and the moved statistics are the eager ones
byte for byte, and so are they when the eval and the step run in one call, or in the write's. GroupObjects asks for
these runs only for a layer serving enough members; below that it keeps the eager calls.
"""

from __future__ import annotations

import numpy as np
import pytest

from converters import REGISTRY
from converters.api import read_spec, write_spec
from converters.equivalence import target_options
from converters.gate.group_objects import KEEP_RUNS_FROM, GroupObjects
from converters.keras_adapter.deferred import is_deferred
from converters.keras_adapter.traced import TracedCalls, kept_calls
from converters.keras_adapter.variables import read_variable, write_variable
from converters.layout import from_channels_first
from converters.options import ConversionOptions
from converters.probe import probe_input
from schemas import NotExpressibleError

from tests.cases import CASES
from tests.converters.gate.test_grouped_check import member
from tests.spec_factory import make_spec

OPTIONS = target_options(ConversionOptions())
KERAS = REGISTRY.framework("keras")


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def runs(run_eval, run_train_step, x):
    """(eval output, training step or the type of error it raised)."""
    out = run_eval(x)
    try:
        return out, run_train_step(x)
    except NotExpressibleError as error:
        return out, type(error)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_traced_writes_and_calls_are_the_eager_ones_bit_for_bit(case):
    try:
        layer = write_spec(case.spec, "keras", OPTIONS)[0]
    except NotExpressibleError as refused:  # Keras cannot hold it: there is no layer to trace
        assert refused.target == "keras"
        return
    if is_deferred(
        layer
    ):  # built on its first call: restate refuses it (GroupObjects rebuilds it), so it never runs traced
        with pytest.raises(ValueError, match="built on its first call"):
            REGISTRY.get("keras", case.spec.kind).restate(layer, case.spec, [])
        return
    x = from_channels_first(probe_input(case.spec), read_spec(layer)[0].layout)
    other = write_spec(member(case.spec, 3), "keras", OPTIONS)[
        0
    ]  # a second member's state, written eagerly by from_spec
    states = [[read_variable(v) for v in layer.weights], [read_variable(v) for v in other.weights]]
    calls = TracedCalls(layer)
    for state in states:  # the trace made for the first state serves the second
        for variable, value in zip(layer.weights, state):
            write_variable(variable, value, layer=layer.name, setting="state")
        eager = runs(lambda x: KERAS.run_eval(layer, x), lambda x: KERAS.run_train_step(layer, x, in_place=True), x)
        eager_after = [read_variable(v) for v in layer.weights]
        calls.write(state)
        assert all(same(read_variable(v), value) for v, value in zip(layer.weights, state)), "written variables"
        traced = runs(calls.run_eval, calls.run_train_step, x)
        assert same(traced[0], eager[0]), "eval output"
        if isinstance(eager[1], type):
            assert traced[1] is eager[1]
        else:
            assert all(same(a, b) for a, b in zip(traced[1], eager[1])), "training output and moved statistics"
        assert all(same(read_variable(v), value) for v, value in zip(layer.weights, eager_after)), (
            "variables after the step"
        )
        for with_write in (False, True):  # the eval and the step in one call, and in the write's call: the same values
            if with_write:
                calls.run_with_next_write(x)
            calls.write(state)
            assert all(same(read_variable(v), value) for v, value in zip(layer.weights, state)), "variables as written"
            if isinstance(eager[1], type):
                with pytest.raises(eager[1]):
                    calls.run_eval_and_train_step(x)
                continue
            out, step = calls.run_eval_and_train_step(x)
            assert same(out, eager[0]) and all(same(a, b) for a, b in zip(step, eager[1])), (
                f"eval and step, with the write: {with_write}"
            )
            if (
                not with_write
            ):  # a step run with the write leaves the state written (GroupObjects writes the next member over it)
                assert all(same(read_variable(v), value) for v, value in zip(layer.weights, eager_after)), (
                    "variables after the step"
                )


def test_group_objects_traces_a_layer_that_serves_enough_members_and_no_other():
    base = member(CASES[0].spec, 0)
    for count, traced in ((2, False), (KEEP_RUNS_FROM, True)):
        objects = GroupObjects(REGISTRY)
        specs = [member(base, i) for i in range(count)]
        objects.write_ahead("keras", specs, OPTIONS)
        layers = {id(objects.write(spec, "keras", OPTIONS)[0]) for spec in specs}
        assert len(layers) == 1  # one layer restated per member
        layer = objects.write(specs[-1], "keras", OPTIONS)[0]
        assert (kept_calls(layer) is not None) is traced


def _llama_with_nine_rmsnorms():
    import transformers

    from tests import real_norms as R

    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        rms_norm_eps=3e-6,
    )
    return R.randomise(
        transformers.LlamaModel(config)
    )  # 2 RMSNorms per block and the final one: 9 of one configuration


def _keras_resnet50():
    from converters.keras_adapter.runtime import import_keras

    return import_keras().applications.ResNet50(weights=None, input_shape=(32, 32, 3))  # 53 BatchNormalization layers


@pytest.mark.slow
@pytest.mark.parametrize(
    "build", [_llama_with_nine_rmsnorms, _keras_resnet50], ids=["transformers Llama", "keras.applications ResNet50"]
)
def test_models_nobody_here_wrote_check_the_same_through_traced_keras_runs(build, monkeypatch):
    from converters import check
    from converters.gate.grouped_check import check_many, groups
    from registry.artifact import extract_artifact
    from tests.converters.gate.test_grouped_check import assert_same

    specs = list(extract_artifact(build()).specs)
    assert max(len(members) for members in groups(specs)) >= KEEP_RUNS_FROM  # a group large enough to run traced
    traced = []
    for name in ("run_eval", "run_eval_and_train_step"):  # the latter where the check asks for a training step too
        real = getattr(TracedCalls, name)
        monkeypatch.setattr(
            TracedCalls, name, lambda self, x, real=real: traced.append(self.layer.name) or real(self, x)
        )
    assert_same(check_many(specs), [check(spec) for spec in specs])
    assert traced  # the Keras leg of the large groups did run traced


def test_group_objects_runs_a_checks_eval_and_step_in_one_call_and_hands_the_step_over_unchanged_only(monkeypatch):
    spec = make_spec("batch", source="torch")
    specs = [member(spec, i) for i in range(KEEP_RUNS_FROM)]
    fresh = write_spec(specs[1], "keras", OPTIONS)[0]  # what check runs: a layer of its own, eagerly
    x = from_channels_first(probe_input(spec), read_spec(fresh)[0].layout)
    expected = KERAS.run_eval(fresh, x), KERAS.run_train_step(fresh, x)
    calls = []
    real = TracedCalls.run_eval_and_train_step
    monkeypatch.setattr(TracedCalls, "run_eval_and_train_step", lambda self, x: calls.append(x) or real(self, x))
    objects = GroupObjects(REGISTRY)
    objects.write_ahead("keras", specs, OPTIONS)
    layer = objects.write(specs[0], "keras", OPTIONS)[0]
    assert kept_calls(layer) is not None
    objects.run_eval(KERAS, layer, x)  # the first member's eval and step run as written: then the probe is known
    objects.run_train_step(KERAS, layer, x)
    assert not calls
    objects.write(specs[1], "keras", OPTIONS)
    out, step = objects.run_eval(KERAS, layer, x), objects.run_train_step(KERAS, layer, x)
    assert len(calls) == 1  # one call for both
    assert same(out, expected[0]) and all(same(a, b) for a, b in zip(step, expected[1]))
    objects.write(specs[1], "keras", OPTIONS)
    objects.run_eval(KERAS, layer, x)
    with pytest.raises(RuntimeError, match="stepped with its eval"):  # a second eval would see the moved statistics
        objects.run_eval(KERAS, layer, x)
    objects.write(specs[1], "keras", OPTIONS)
    objects.run_eval(KERAS, layer, x)
    with pytest.raises(RuntimeError, match="stepped with its eval"):  # a step on another input is not the one that ran
        objects.run_train_step(KERAS, layer, x + 1)


def test_group_objects_runs_a_members_eval_and_step_in_the_call_that_writes_it_once_it_knows_the_probe(monkeypatch):
    specs = [member(make_spec("batch", source="torch"), i) for i in range(KEEP_RUNS_FROM)]
    objects = GroupObjects(REGISTRY)
    objects.write_ahead("keras", specs, OPTIONS)
    calls = []
    real = TracedCalls._call
    monkeypatch.setattr(TracedCalls, "_call", lambda self, name, inputs: calls.append(name) or real(self, name, inputs))
    for index, spec in enumerate(specs):
        layer = objects.write(spec, "keras", OPTIONS)[0]
        if kept_calls(layer) is None:
            continue
        fresh = write_spec(spec, "keras", OPTIONS)[0]  # what check runs on: a layer of its own, eagerly
        x = from_channels_first(probe_input(spec), read_spec(fresh)[0].layout)
        assert same(
            read_variable(layer.weights[0]), read_variable(fresh.weights[0])
        )  # the spec reads the state written
        out, step = objects.run_eval(KERAS, layer, x), objects.run_train_step(KERAS, layer, x)
        expected = KERAS.run_eval(fresh, x), KERAS.run_train_step(fresh, x)
        assert same(out, expected[0]) and all(same(a, b) for a, b in zip(step, expected[1])), spec.name
    assert calls == ["write+both"] * (
        KEEP_RUNS_FROM - 1
    )  # one call per member after the first: its write, eval and step
