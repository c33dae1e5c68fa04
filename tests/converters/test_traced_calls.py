"""A Keras layer's traced writes and calls (converters/keras_adapter/traced.py) are its eager ones, bit for bit.

check_many runs a layer serving many members of one configuration through tf.functions traced once (without grappler);
`check` calls it eagerly. On every case of the table Keras builds a layer for, after the layer is given a second member's
state: the written variables, the eval output, the training output and the moved statistics are the eager ones byte for
byte. The bench asks for these runs only for a layer serving enough members; below that it keeps the eager calls.
"""

from __future__ import annotations

import numpy as np
import pytest

from converters import REGISTRY
from converters.api import read_spec, write_spec
from converters.equivalence import target_options
from converters.grouped_check import KEEP_RUNS_FROM, GroupBench
from converters.keras_adapter.deferred import is_deferred
from converters.keras_adapter.traced import TracedCalls, kept_calls
from converters.keras_adapter.variables import read_variable, write_variable
from converters.layout import from_channels_first
from converters.options import ConversionOptions
from converters.probe import probe_input
from schemas import NotExpressibleError

from tests.cases import CASES
from tests.converters.test_grouped_check import member

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
    if is_deferred(layer):  # built on its first call: restate refuses it (the bench rebuilds it), so it never runs traced
        with pytest.raises(ValueError, match="built on its first call"):
            REGISTRY.get("keras", case.spec.kind).restate(layer, case.spec, [])
        return
    x = from_channels_first(probe_input(case.spec), read_spec(layer)[0].layout)
    other = write_spec(member(case.spec, 3), "keras", OPTIONS)[0]  # a second member's state, written eagerly by from_spec
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
        assert all(same(read_variable(v), value) for v, value in zip(layer.weights, eager_after)), "variables after the step"


def test_the_bench_traces_a_layer_that_serves_enough_members_and_no_other():
    base = member(CASES[0].spec, 0)
    for count, traced in ((2, False), (KEEP_RUNS_FROM, True)):
        bench = GroupBench(REGISTRY)
        specs = [member(base, i) for i in range(count)]
        bench.write_ahead("keras", specs, OPTIONS)
        layers = {id(bench.write(spec, "keras", OPTIONS)[0]) for spec in specs}
        assert len(layers) == 1  # one layer restated per member
        layer = bench.write(specs[-1], "keras", OPTIONS)[0]
        assert (kept_calls(layer) is not None) is traced


def _llama_with_nine_rmsnorms():
    import transformers

    from tests import real_norms as R

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=64, rms_norm_eps=3e-6)
    return R.randomise(transformers.LlamaModel(config))  # 2 RMSNorms per block and the final one: 9 of one configuration


def _keras_resnet50():
    from converters.keras_adapter.runtime import import_keras

    return import_keras().applications.ResNet50(weights=None, input_shape=(32, 32, 3))  # 53 BatchNormalization layers


@pytest.mark.slow
@pytest.mark.parametrize("build", [_llama_with_nine_rmsnorms, _keras_resnet50], ids=["transformers Llama", "keras.applications ResNet50"])
def test_models_nobody_here_wrote_check_the_same_through_traced_keras_runs(build, monkeypatch):
    from converters import check
    from converters.grouped_check import check_many, groups
    from registry.artifact import extract_artifact
    from tests.converters.test_grouped_check import assert_same

    specs = list(extract_artifact(build()).specs)
    assert max(len(members) for members in groups(specs)) >= KEEP_RUNS_FROM  # a group large enough to run traced
    traced = []
    real = TracedCalls.run_eval
    monkeypatch.setattr(TracedCalls, "run_eval", lambda self, x: traced.append(self.layer.name) or real(self, x))
    assert_same(check_many(specs), [check(spec) for spec in specs])
    assert traced  # the Keras leg of the large groups did run traced
