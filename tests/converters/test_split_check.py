"""The gate's legs run in a worker process (converters/split_check.py) give exactly what an in-process check gives.

Same CheckResult, field for field, for passing layers, layers a target cannot express, and the
deliberately broken adapters of tests/buggy_torch.py: moving a leg to a worker makes no check laxer.
"""

from __future__ import annotations

import pytest

import converters
from converters.split_check import SplitCheck

from tests.converters.test_check import buggy_registry
from tests.spec_factory import make_spec

pytestmark = pytest.mark.slow  # starts worker processes

SPECS = [
    make_spec("batch", source="torch", name="bn"),
    make_spec("batch", source="torch", dtype="float16", name="bn_half"),
    make_spec("batch", source="torch", momentum=None, name="bn_cumulative"),  # keras and onnx cannot express it
    make_spec("batch", source="torch", training=True, name="bn_train"),  # onnx refuses train mode
    make_spec("layer", source="torch", dtype="float64", name="ln"),
    make_spec("rms", source="torch", name="rms"),
    make_spec("group", source="torch", name="gn"),
    make_spec("instance", source="torch", dtype="bfloat16", name="inorm"),  # onnxruntime skips bfloat16
    make_spec("batch", source="keras", layout="channels_last", convention="running_weight", momentum=0.99, name="keras_bn"),
]


def test_legs_in_a_worker_give_the_in_process_results():
    got = SplitCheck(in_worker=["keras", "onnx"]).check_all(SPECS)
    for spec, result in zip(SPECS, got):
        assert result.model_dump() == converters.check(spec).model_dump(), spec.name


def test_the_deliberately_broken_adapters_still_fail_when_their_leg_runs_in_the_worker():
    registry = buggy_registry()
    specs = [make_spec("layer", eps=1e-3, normalized_shape=(16,), source="torch"), make_spec("batch", source="torch")]
    got = SplitCheck(registry=registry, in_worker=["torch"]).check_all(specs)
    for spec, result in zip(specs, got):
        expected = converters.check(spec, registry=registry)
        assert not result.passed and not expected.passed
        assert result.model_dump() == expected.model_dump()


def test_a_gate_with_every_leg_here_is_converters_check_many_itself(monkeypatch):
    seen = []
    monkeypatch.setattr(converters, "check_many", lambda specs, **legs: [seen.append((spec.name, legs["frameworks"])) or "checked" for spec in specs])
    assert SplitCheck(in_worker=[]).check_all(SPECS[:2]) == ["checked", "checked"]
    assert seen == [("bn", ["torch", "keras", "onnx"]), ("bn_half", ["torch", "keras", "onnx"])]
