"""The gate's legs run in a worker process (converters/gate/split_check.py) give exactly what an in-process check gives.

Same CheckResult, field for field, on the whole case table (tests/cases.py, as read from the spec and as
read from torch) and these extra specs: passing layers, layers a target cannot express, and the
deliberately broken adapters of tests/buggy_torch.py: moving a leg to a worker makes no check laxer.
The shared worker is compared the same way in tests/converters/gate/test_shared_worker.py, and legs spread over a second
process where every framework is imported here (`spread`, as the shared worker's registrations run) below.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import converters
from converters.gate.split_check import SplitCheck

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
    make_spec(
        "batch", source="keras", layout="channels_last", convention="running_weight", momentum=0.99, name="keras_bn"
    ),
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


@pytest.mark.parametrize(
    "in_worker", [["torch"], ["keras", "onnx"]], ids=["broken leg in the worker", "broken round trips back here"]
)
def test_the_deliberately_broken_adapters_still_fail_when_their_leg_runs_in_the_worker(in_worker):
    """The broken torch adapter's own leg in the worker; or the Keras and ONNX legs there, whose round trips back to the
    broken torch adapter run here (converters/gate/round_trips.py) and must fail those targets as check does."""
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
    """The normalizers of models nobody here wrote: a transformers Llama and Gemma (hand-rolled RMSNorms, Gemma's x *
    (1 + w)) and DETR (frozen BatchNorms, LayerNorms) from tiny configs with random state (tests/real_norms.py), and
    keras.applications MobileNet (weights=None) with random statistics."""
    import keras
    import numpy as np

    from converters.adapters import REGISTRY
    from tests import real_norms as R

    specs = [
        spec
        for make in (R.llama, R.gemma, R.detr)
        for spec in REGISTRY.model_adapter("torch").layer_specs(R.randomise(make()))
    ]
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
    here (converters/gate/round_trips.py): the results are check's, field for field."""
    specs = real_model_specs()
    by_source = {"torch": (["keras", "onnx"], "libtorch"), "keras": (["torch", "onnx"], "libtensorflow")}
    assert {spec.source.framework for spec in specs} == set(by_source) and len(specs) > 40
    for source, (legs, library) in by_source.items():
        mine = [spec for spec in specs if spec.source.framework == source]
        split = SplitCheck(in_worker=legs)
        got = split.check_all(mine)
        assert (
            library not in Path(f"/proc/{split._workers[source].pid}/maps").read_text()
        )  # it never loaded the source framework
        for spec, result in zip(mine, got):
            assert result.model_dump() == converters.check(spec).model_dump(), spec.name


def test_a_gate_with_every_leg_here_is_converters_check_many_itself(monkeypatch):
    seen = []
    monkeypatch.setattr(
        converters,
        "check_many",
        lambda specs, **legs: [seen.append((spec.name, legs["frameworks"])) or "checked" for spec in specs],
    )
    assert SplitCheck(in_worker=[]).check_all(SPECS[:2]) == ["checked", "checked"]
    assert seen == [("bn", ["torch", "keras", "onnx"]), ("bn_half", ["torch", "keras", "onnx"])]


def test_the_workers_legs_go_in_one_request_per_source_and_legs(monkeypatch):
    """One request carries every spec of a source framework (WorkerConnection.submit_many, checked by check_many
    there)."""
    from converters.gate.worker_client import WorkerConnection

    sent = []
    original = WorkerConnection.send
    monkeypatch.setattr(
        WorkerConnection,
        "send",
        lambda self, header, tensors, progress=None: sent.append(header) or original(self, header, tensors, progress),
    )
    got = SplitCheck(in_worker=["keras", "onnx"]).check_all(SPECS)
    checks = [header for header in sent if "specs" in header or "spec" in header]
    assert sorted((header["specs"][0]["source"]["framework"], len(header["specs"])) for header in checks) == [
        ("keras", 1),
        ("torch", 8),
    ]
    for spec, result in zip(SPECS, got):
        assert result.model_dump() == converters.check(spec).model_dump(), spec.name


def test_a_request_that_raises_is_asked_again_spec_by_spec_and_raises_the_first_specs_error():
    from tests.converters.gate.test_grouped_check import raising_case

    registry, specs = raising_case()
    with pytest.raises(RuntimeError) as plain:
        [converters.check(spec, registry=registry) for spec in specs]
    with pytest.raises(Exception) as split:
        SplitCheck(registry=registry, in_worker=["torch"]).check_all(specs)
    assert str(split.value) == str(plain.value) == "boom_first: the adapter broke"


# Spread legs (SplitCheck's `spread`, as the shared worker's registrations run: registry/worker_jobs.py): every
# framework is imported here, and the named legs still run in a second warm process, the spread child,
# at the same time as the rest.

SPREAD = ("torch", "keras")
#: Torch-source specs (the case table as read from torch and the torch specs above) and the one Keras spec, whose torch
#: leg goes to the child the other way round.
SPREAD_SPECS = [as_torch(case.spec) for case in CASES] + SPECS


@pytest.fixture
def spread():
    """Legs spread over a real child, warm before the gate starts (a gate that finds it importing runs every leg
    here)."""
    from converters.gate import split_check
    from converters.adapters import REGISTRY

    split_check.start_spread(SPREAD, REGISTRY.packages).result(timeout=300)
    return split_check


def spread_gate(registry=None, own: str = "torch") -> SplitCheck:
    import keras  # noqa: F401  every framework imported here, as in the shared worker
    import onnx  # noqa: F401
    import torch  # noqa: F401

    return SplitCheck(own, spread=SPREAD) if registry is None else SplitCheck(own, registry=registry, spread=SPREAD)


def test_spread_legs_give_the_in_process_results_and_run_in_the_child_with_their_round_trips(spread):
    split = spread_gate()
    got = split.check_all(SPREAD_SPECS)
    assert split._spread == SPREAD and set(split._workers) == {"torch", "keras"}  # both sources' legs went to the child
    assert split._workers["torch"] is split._workers["keras"]
    maps = Path(f"/proc/{split._workers['torch'].pid}/maps").read_text()
    assert "libtensorflow" in maps and "libtorch" in maps  # so the round trips back to either source run there
    expected = [converters.check(spec).model_dump() for spec in SPREAD_SPECS]
    assert not all(result["passed"] for result in expected)  # failures among them: compared as they are
    for spec, result, wanted in zip(SPREAD_SPECS, got, expected):
        assert result.model_dump() == wanted, spec.name


def test_the_deliberately_broken_adapters_still_fail_with_legs_spread(spread):
    """The broken torch adapter's leg of a Keras spec and the Keras leg of torch specs (whose round trips go back to the
    broken torch adapter) run in the child, which is that registry's own: they fail as check fails them."""
    registry = buggy_registry()
    spread.start_spread(SPREAD, registry.packages).result(timeout=300)
    specs = [
        make_spec("layer", eps=1e-3, normalized_shape=(16,), source="torch"),
        make_spec("batch", source="torch"),
        make_spec(
            "batch", source="keras", layout="channels_last", convention="running_weight", momentum=0.99, name="keras_bn"
        ),
    ]
    split = spread_gate(registry)
    got = split.check_all(specs)
    assert split._spread == SPREAD
    for spec, result in zip(specs, got):
        expected = converters.check(spec, registry=registry)
        assert not expected.passed and result.model_dump() == expected.model_dump(), spec.name


def test_a_spread_child_that_dies_before_answering_has_its_legs_run_here(spread, monkeypatch):
    """Killed once the gate's legs were sent: the legs run in this process, none skipped;
    the next gate starts a new child."""
    import os
    import signal

    killed = []

    def kill_the_child(self):
        pid = self._workers["torch"].pid
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    monkeypatch.setattr(SplitCheck, "_prepare_next", kill_the_child)
    split = spread_gate()
    specs = SPECS[:8]
    got = split.check_all(specs)
    assert killed and split._spread == SPREAD
    for spec, result in zip(specs, got):
        assert result.model_dump() == converters.check(spec).model_dump(), spec.name
    monkeypatch.undo()
    from converters.adapters import REGISTRY

    again = spread.start_spread(SPREAD, REGISTRY.packages)
    again.result(timeout=300)
    split = spread_gate()
    assert split.check_all(specs[:1])[0].model_dump() == converters.check(specs[0]).model_dump()
    assert split._spread == SPREAD and split._workers["torch"].pid != killed[0]


def test_a_gate_that_finds_the_spread_child_importing_runs_every_leg_here(spread, monkeypatch):
    from concurrent.futures import Future

    from converters.adapters import REGISTRY

    child, _ = spread._spread_child(REGISTRY.packages, SPREAD)
    monkeypatch.setitem(spread._SPREAD_WARM, child, Future())  # its warm-up not answered yet
    seen = []
    original = converters.check_many
    monkeypatch.setattr(
        converters, "check_many", lambda specs, **legs: seen.append(legs["frameworks"]) or original(specs, **legs)
    )
    split = spread_gate()
    got = split.check_all(SPECS[:2])
    assert split._spread == () and not split._workers and seen == [["torch", "keras", "onnx"]]
    assert [r.model_dump() for r in got] == [converters.check(spec).model_dump() for spec in SPECS[:2]]
