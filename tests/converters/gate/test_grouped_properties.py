"""Property-based: check_many over groups of one random configuration with different states equals check,
member by member.

Random kinds, shapes, dtypes, eps, momentum, flags and layouts, read from each framework (so the round trips run); in
some examples one
member carries a scale the adapter package of tests/buggy_torch_values.py converts wrongly: it alone must fail, in
both paths. In half the examples the Keras layers run traced from the first member (converters/keras_adapter/traced.py;
these groups are smaller than KEEP_RUNS_FROM, so otherwise they run eagerly). HYPOTHESIS_PROFILE=thorough runs more
examples.
"""

from __future__ import annotations

from hypothesis import assume, given, strategies as st

import converters
from converters.gate import group_objects, kept_objects
from converters.gate.grouped_check import check_many, groups
from schemas import NotExpressibleError

from tests.buggy_torch_values import SATURATION
from tests.converters.gate.test_grouped_check import assert_same, values_registry
from tests.converters.test_properties import configurations as property_configurations
from tests.spec_factory import make_spec


def configurations():
    """make_spec's arguments for one random configuration (the state comes from the seed, drawn per member);
    float16 too."""
    return property_configurations(dtypes=("float32", "float32", "float64", "float16", "bfloat16"))


def members(config: dict, seeds: list[int], source: str) -> list:
    """One spec per seed, read from `source`'s layer for it (so it is one that framework holds),
    or as made for "spec"."""
    made = [make_spec(**config, seed=seed, name=f"m{i}/{config['kind']}") for i, seed in enumerate(seeds)]
    if source == "spec":
        return made
    try:
        return [converters.to_spec(converters.from_spec(spec, source)) for spec in made]
    except NotExpressibleError:
        assume(False)


@given(
    config=configurations(),
    seeds=st.lists(st.integers(0, 2**16), min_size=2, max_size=4, unique=True),
    source=st.sampled_from(["spec", "torch", "keras", "onnx"]),
    broken=st.booleans(),
    traced=st.booleans(),
)
def test_a_group_of_one_configuration_gives_checks_results_member_by_member(config, seeds, source, broken, traced):
    specs = members(config, seeds, source)
    registry = converters.REGISTRY
    victim = None
    if broken and "scale" in specs[0].tensors:
        registry, victim = values_registry(), len(specs) // 2
        scale = specs[victim].tensors["scale"].copy()
        scale.flat[-1] = 2 * SATURATION
        specs[victim] = specs[victim].replace(tensors={**specs[victim].tensors, "scale": scale})
    assume(
        len(groups(specs)) == 1
    )  # a framework may read a state-dependent setting (a frozen identity scale) differently
    plain = [converters.check(spec, registry=registry) for spec in specs]
    keep = group_objects.KEEP_RUNS_FROM
    group_objects.KEEP_RUNS_FROM = 1 if traced else keep
    kept_objects.forget()  # objects built afresh: an earlier example's layer may run traced
    try:
        grouped = check_many(specs, registry=registry)
    finally:
        group_objects.KEEP_RUNS_FROM = keep
    assert_same(grouped, plain)
    for index, result in enumerate(grouped):
        torch_built = any(t.framework == "torch" and t.status != "not_expressible" for t in result.targets)
        if index == victim and torch_built:
            assert not result.passed, "the member the broken adapter converts wrongly must fail"
        elif index != victim:
            assert result.passed, result.render_text()
