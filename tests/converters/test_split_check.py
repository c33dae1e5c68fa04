"""The gate's legs run in a worker process (converters/split_check.py) give exactly what an in-process check gives.

Same CheckResult, field for field, on the whole case table (tests/cases.py, as read from the spec and as
read from torch) and these extra specs: passing layers, layers a target cannot express, and the
deliberately broken adapters of tests/buggy_torch.py: moving a leg to a worker makes no check laxer.
The shared worker is compared the same way in tests/converters/test_shared_worker.py.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import converters
from converters.split_check import SplitCheck

from tests.cases import CASES
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


def as_torch(spec):
    """The spec as if read from torch: the round trip then goes back to torch too."""
    return spec.replace(source=spec.source.model_copy(update={"framework": "torch"}))


#: Every row of the case table, as the spec and as read from torch, and the specs above.
ALL_SPECS = [case.spec for case in CASES] + [as_torch(case.spec) for case in CASES] + SPECS


@functools.cache
def in_process_results() -> list[dict]:
    """`converters.check` of ALL_SPECS in this process, every leg here (computed once for both worker kinds)."""
    return [converters.check(spec).model_dump() for spec in ALL_SPECS]


def test_legs_in_a_worker_give_the_in_process_results():
    got = SplitCheck(in_worker=["keras", "onnx"]).check_all(ALL_SPECS)
    for spec, result, expected in zip(ALL_SPECS, got, in_process_results()):
        assert result.model_dump() == expected, spec.name


@pytest.mark.parametrize("in_worker", [["torch"], ["keras", "onnx"]], ids=["broken leg in the worker", "broken round trips back here"])
def test_the_deliberately_broken_adapters_still_fail_when_their_leg_runs_in_the_worker(in_worker):
    """The broken torch adapter's own leg in the worker; or the Keras and ONNX legs there, whose round trips back to the
    broken torch adapter run here (converters/round_trips.py) and must fail those targets as check does."""
    registry = buggy_registry()
    specs = [make_spec("layer", eps=1e-3, normalized_shape=(16,), source="torch"), make_spec("batch", source="torch")]
    got = SplitCheck(registry=registry, in_worker=in_worker).check_all(specs)
    for spec, result in zip(specs, got):
        expected = converters.check(spec, registry=registry)
        assert not result.passed and not expected.passed
        assert result.model_dump() == expected.model_dump()


def test_the_worker_never_loads_the_source_framework_its_round_trips_go_back_to():
    """A torch spec's Keras and ONNX legs in a worker: the round trips back to torch run in this process, so the worker
    (a private child here; the shared one alike) has TensorFlow and onnxruntime mapped and no libtorch."""
    split = SplitCheck(in_worker=["keras", "onnx"])
    spec = make_spec("batch", source="torch", name="bn")
    assert split.check_all([spec])[0].model_dump() == converters.check(spec).model_dump()
    maps = Path(f"/proc/{split._workers['torch'].pid}/maps").read_text()
    assert "libtensorflow" in maps and "onnxruntime" in maps
    assert "libtorch" not in maps


def real_model_specs() -> list:
    """The normalizers of models nobody here wrote: a transformers Llama and Gemma (hand-rolled RMSNorms, Gemma's x * (1 + w))
    and DETR (frozen BatchNorms, LayerNorms) from tiny configs with random state (tests/real_norms.py), and keras.applications
    MobileNet (weights=None) with random statistics."""
    import keras
    import numpy as np

    from converters.adapters import REGISTRY
    from tests import real_norms as R

    specs = [spec for make in (R.llama, R.gemma, R.detr) for spec in REGISTRY.model_adapter("torch").layer_specs(R.randomise(make()))]
    keras.utils.set_random_seed(0)
    mobilenet = keras.applications.MobileNet(input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=10)
    rng = np.random.default_rng(0)
    for layer in mobilenet.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(rng.uniform(-1, 1, layer.moving_mean.shape))
            layer.moving_variance.assign(rng.uniform(0.5, 1.5, layer.moving_variance.shape))
    return specs + REGISTRY.model_adapter("keras").layer_specs(mobilenet)


def test_real_models_legs_in_a_worker_without_their_framework_give_the_in_process_results():
    """Each model's other legs in a worker that has not imported the model's framework, so every round trip back runs
    here (converters/round_trips.py): the results are check's, field for field."""
    specs = real_model_specs()
    by_source = {"torch": (["keras", "onnx"], "libtorch"), "keras": (["torch", "onnx"], "libtensorflow")}
    assert {spec.source.framework for spec in specs} == set(by_source) and len(specs) > 40
    for source, (legs, library) in by_source.items():
        mine = [spec for spec in specs if spec.source.framework == source]
        split = SplitCheck(in_worker=legs)
        got = split.check_all(mine)
        assert library not in Path(f"/proc/{split._workers[source].pid}/maps").read_text()  # it never loaded the source framework
        for spec, result in zip(mine, got):
            assert result.model_dump() == converters.check(spec).model_dump(), spec.name


def test_a_gate_with_every_leg_here_is_converters_check_many_itself(monkeypatch):
    seen = []
    monkeypatch.setattr(converters, "check_many", lambda specs, **legs: [seen.append((spec.name, legs["frameworks"])) or "checked" for spec in specs])
    assert SplitCheck(in_worker=[]).check_all(SPECS[:2]) == ["checked", "checked"]
    assert seen == [("bn", ["torch", "keras", "onnx"]), ("bn_half", ["torch", "keras", "onnx"])]


def test_the_workers_legs_go_in_one_request_per_source_and_legs(monkeypatch):
    """One request carries every spec of a source framework (LegWorker.submit_many, checked by check_many there)."""
    from converters.leg_client import LegWorker

    sent = []
    original = LegWorker.send
    monkeypatch.setattr(LegWorker, "send", lambda self, header, tensors, progress=None: sent.append(header) or original(self, header, tensors, progress))
    got = SplitCheck(in_worker=["keras", "onnx"]).check_all(SPECS)
    checks = [header for header in sent if "specs" in header or "spec" in header]
    assert sorted((header["specs"][0]["source"]["framework"], len(header["specs"])) for header in checks) == [("keras", 1), ("torch", 8)]
    for spec, result in zip(SPECS, got):
        assert result.model_dump() == converters.check(spec).model_dump(), spec.name


def test_a_request_that_raises_is_asked_again_spec_by_spec_and_raises_the_first_specs_error():
    from tests.converters.test_grouped_check import raising_case

    registry, specs = raising_case()
    with pytest.raises(RuntimeError) as plain:
        [converters.check(spec, registry=registry) for spec in specs]
    with pytest.raises(Exception) as split:
        SplitCheck(registry=registry, in_worker=["torch"]).check_all(specs)
    assert str(split.value) == str(plain.value) == "boom_first: the adapter broke"
