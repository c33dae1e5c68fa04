"""converters.check_many gives, field for field, what `[check(s) for s in specs]` gives,
while building each object once.

Every case of the case table, with several members of one configuration holding different states and names, read
from each framework (so the round trips back to the source run too); the deliberately broken adapters of
tests/buggy_torch.py and tests/buggy_torch_values.py (a bug only some members' states trigger); a member whose check
raises; a Checker answering one spec at a time. Grouping must make no check laxer. Every test runs twice: with the
Keras layers run eagerly (groups smaller than KEEP_RUNS_FROM) and traced from the first member
(converters/keras_adapter/traced.py), so a failing member fails through the traced calls too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import converters
from converters.gate import group_objects, kept_objects
from converters.adapters import AdapterRegistry
from converters.gate.grouped_check import Checker, check_many, configuration, groups, restatable
from schemas import NormSpec, NotExpressibleError

from tests.buggy_torch_values import SATURATION
from tests.cases import CASES
from tests.converters.test_check import buggy_registry
from tests.spec_factory import make_spec

FRAMEWORKS = ("torch", "keras", "onnx")


@pytest.fixture(autouse=True, params=["eager", "traced"])
def keras_runs(request, monkeypatch):
    """Every test with the Keras layers run eagerly (these groups are small) and traced from a group's first member;
    each test's calls build their objects afresh (no objects kept from an earlier test, whose layers may run traced)."""
    kept_objects.forget()
    if request.param == "traced":
        monkeypatch.setattr(group_objects, "KEEP_RUNS_FROM", 1)
    return request.param


def fields(result) -> str:
    """Every field of a CheckResult, floats by their exact repr (NaN and infinities included),
    for comparing bit for bit."""
    return json.dumps(result.model_dump(mode="python"), sort_keys=True, default=repr)


def assert_same(grouped: list, plain: list) -> None:
    assert len(grouped) == len(plain)
    for got, expected in zip(grouped, plain):
        assert fields(got) == fields(expected), f"{expected.layer}: check_many differs from check\n{got}\n{expected}"


def member(spec: NormSpec, index: int, name: str | None = None) -> NormSpec:
    """`spec` with state moved by a member-specific factor (still valid: variances stay positive) and its own name."""
    factor = 1.0 + index / 7.0
    tensors = {
        key: value if key == "num_batches_tracked" else (value.astype(np.float64) * factor).astype(value.dtype)
        for key, value in spec.tensors.items()
    }
    return spec.replace(name=name or f"{spec.name}_{index}", tensors=tensors)


def read_from(spec: NormSpec, framework: str) -> NormSpec | None:
    """The spec `framework`'s layer for `spec` reads back as (its source is then that framework),
    None if it cannot hold it."""
    try:
        return converters.to_spec(converters.from_spec(spec, framework))
    except NotExpressibleError:
        return None


@pytest.mark.parametrize("number", range(len(CASES)), ids=[case.id for case in CASES])
def test_every_case_of_the_table_gives_the_results_check_gives(number):
    case = CASES[number]
    specs = [
        member(case.spec, i, f"{case.id}/m{i}") for i in range(2)
    ]  # '/': Keras renames the layer, and must rename it back
    # Read from a framework (each case from one, in turn): the round trip back to it runs too.
    read = read_from(case.spec, FRAMEWORKS[number % 3]) or read_from(case.spec, FRAMEWORKS[(number + 1) % 3])
    if read is not None:
        specs += [member(read, i) for i in range(2)]
    assert len(groups(specs)) == len(specs) // 2  # the members of one configuration are one group
    assert_same(check_many(specs), [converters.check(spec) for spec in specs])


def test_the_broken_adapters_fail_in_check_many_as_in_check():
    registry = buggy_registry()
    specs = [
        make_spec("layer", eps=1e-3, normalized_shape=(16,), source="torch", name=f"ln{i}", seed=i) for i in range(3)
    ]
    specs += [make_spec("batch", source="torch", name=f"bn{i}", seed=i) for i in range(3)]
    grouped = check_many(specs, registry=registry)
    assert not any(result.passed for result in grouped)
    assert_same(grouped, [converters.check(spec, registry=registry) for spec in specs])


def values_registry() -> AdapterRegistry:
    return AdapterRegistry(
        {"torch": "tests.buggy_torch_values", "keras": "converters.keras_adapter", "onnx": "converters.onnx_adapter"}
    )


@pytest.mark.parametrize("kind", ["batch", "layer", "rms", "group", "instance"])
def test_a_bug_only_one_members_state_triggers_fails_that_member_alone(kind):
    registry = values_registry()
    base = make_spec(kind, source="torch", tracked=kind != "instance", momentum=None if kind == "instance" else 0.01)
    specs = [member(base, i) for i in range(4)]
    scale = specs[2].tensors["scale"].copy()
    scale.flat[0] = 2 * SATURATION
    specs[2] = specs[2].replace(tensors={**specs[2].tensors, "scale": scale})
    assert len(groups(specs)) == 1
    grouped = check_many(specs, registry=registry)
    assert [result.passed for result in grouped] == [True, True, False, True]
    assert any("tensors.scale" in difference for target in grouped[2].targets for difference in target.spec_differences)
    assert_same(grouped, [converters.check(spec, registry=registry) for spec in specs])


def test_an_overriding_adapter_is_never_restated_and_the_stock_ones_are():
    stock, broken = converters.REGISTRY, buggy_registry()
    assert all(
        restatable(stock.get(framework, kind))
        for framework in ("torch", "keras")
        for kind in ("batch", "layer", "rms", "group", "instance")
    )
    assert not restatable(broken.get("torch", "layer")) and not restatable(broken.get("torch", "batch"))
    assert not any(
        restatable(values_registry().get("torch", kind)) for kind in ("batch", "layer", "rms", "group", "instance")
    )
    assert not restatable(stock.get("onnx", "batch"))  # ONNX models are written per member


@pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)
def test_a_member_whose_state_overflows_fails_alone():
    base = make_spec("batch", source="torch", dtype="float16", eps=1e-3)
    specs = [member(base, i) for i in range(3)]
    huge = np.full_like(specs[1].tensors["scale"], 3e4)  # x * 3e4 overflows float16 in every framework
    specs[1] = specs[1].replace(tensors={**specs[1].tensors, "scale": huge})
    grouped = check_many(specs)
    assert [result.passed for result in grouped] == [True, False, True]
    assert_same(grouped, [converters.check(spec) for spec in specs])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_members_of_equal_state_step_from_their_own_statistics_in_onnx(dtype):
    """Never-trained BatchNorms all hold the same state. In one merged onnxruntime session their float16 Casts became
    one value and the second member's training step started from the first one's moved statistics
    (merged_runs._stepped_state_shared)."""
    specs = [make_spec("batch", dtype=dtype, source="torch", name=f"bn{i}") for i in range(3)]
    assert len(groups(specs)) == 1 and all(
        np.array_equal(specs[0].tensors["running_mean"], s.tensors["running_mean"]) for s in specs
    )
    for frameworks in (["onnx"], list(FRAMEWORKS)):
        assert_same(
            check_many(specs, frameworks=frameworks), [converters.check(spec, frameworks=frameworks) for spec in specs]
        )


def raising_case() -> tuple[AdapterRegistry, list[NormSpec]]:
    """A registry whose torch adapter crashes on layers named 'boom...' (tests/buggy_torch_raising.py), and three specs:
    a fine one, then two that crash; the error every gate must raise is the first one's, "boom_first:
    the adapter broke"."""
    registry = AdapterRegistry(
        {"torch": "tests.buggy_torch_raising", "keras": "converters.keras_adapter", "onnx": "converters.onnx_adapter"}
    )
    specs = [
        make_spec("rms", source="torch", name="fine", normalized_shape=(8,)),
        make_spec("layer", source="torch", name="boom_first"),
        make_spec("rms", source="torch", name="boom_second", normalized_shape=(8,), seed=3),
    ]
    return registry, specs


def test_check_many_raises_what_check_raises_for_the_first_spec_that_raises():
    registry, specs = raising_case()
    with pytest.raises(RuntimeError) as plain:
        [converters.check(spec, registry=registry) for spec in specs]
    with pytest.raises(RuntimeError) as grouped:
        check_many(specs, registry=registry)
    assert str(grouped.value) == str(plain.value) == "boom_first: the adapter broke"


def test_a_member_restate_cannot_give_its_state_is_built_by_from_spec():
    registry = AdapterRegistry(
        {"torch": "tests.fragile_restate_torch", "keras": "converters.keras_adapter", "onnx": "converters.onnx_adapter"}
    )
    assert restatable(registry.get("torch", "batch"))
    specs = [
        member(make_spec("batch", source="torch"), i, name) for i, name in enumerate(["bn", "fragile_bn", "bn_after"])
    ]
    grouped = check_many(specs, registry=registry)
    assert all(result.passed for result in grouped)
    assert_same(grouped, [converters.check(spec, registry=registry) for spec in specs])


def test_a_checker_answering_one_spec_at_a_time_gives_checks_results():
    checker = Checker()
    specs = [member(make_spec(kind, source="torch"), i) for i in range(3) for kind in ("batch", "rms", "group")]
    assert_same([checker.check(spec) for spec in specs], [converters.check(spec) for spec in specs])
    frameworks = ["keras"]  # as a leg worker is asked
    assert_same(
        [checker.check(spec, frameworks) for spec in specs], [converters.check(spec, frameworks) for spec in specs]
    )


def test_a_later_call_checks_on_the_objects_an_earlier_one_built_and_gives_checks_results(monkeypatch):
    """check_many keeps its objects for the process's later calls (converters/gate/kept_objects.py): a second model's
    members of the configurations the first one checked are checked on the layers (and, traced, the runs) built then,
    and a member the broken adapter converts wrongly still fails alone."""
    registry = values_registry()
    built = []
    for kind in ("batch", "rms"):
        adapter = registry.get("keras", kind)
        monkeypatch.setattr(
            adapter, "from_spec", lambda *args, real=adapter.from_spec: built.append(args[0].name) or real(*args)
        )
    specs = [member(make_spec(kind, source="torch"), i) for i in range(6) for kind in ("batch", "rms")]
    scale = specs[8].tensors["scale"].copy()
    scale.flat[0] = 2 * SATURATION
    specs[8] = specs[8].replace(tensors={**specs[8].tensors, "scale": scale})
    first = check_many(specs[:6], registry=registry)
    assert len(built) == 2  # one Keras layer per configuration
    later = check_many(specs[6:], registry=registry)
    assert len(built) == 2  # none built again
    assert [result.passed for result in later] == [True, True, False, True, True, True]
    assert_same(first + later, [converters.check(spec, registry=registry) for spec in specs])


def test_the_configuration_is_everything_but_the_name_and_the_values():
    spec = make_spec("batch", source="torch")
    assert configuration(member(spec, 3)) == configuration(spec)
    assert configuration(spec.replace(eps=2e-3)) != configuration(spec)
    assert configuration(
        spec.replace(tensors={**spec.tensors, "num_batches_tracked": np.array(8, np.int64)})
    ) != configuration(spec)
    assert configuration(make_spec("batch", source="torch", dtype="float64")) != configuration(spec)
