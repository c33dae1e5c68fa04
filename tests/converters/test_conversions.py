"""Every case through every (source, target) framework pair, judged by the NumPy reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import converters
from converters.equivalence import ROUND_TRIP_IGNORED
from schemas import FRAMEWORKS, NotExpressibleError, spec_differences

from tests.cases import CASES
from tests.harness import assert_matches_reference

PAIRS = [
    pytest.param(case, source, target, id=f"{case.id}-{source}-to-{target}")
    for case in CASES
    for source, target in itertools.product(FRAMEWORKS, FRAMEWORKS)
    if not {source, target} & (case.refused_by | case.expressed_by)
]
REFUSALS = [
    pytest.param(case, target, id=f"{case.id}-{target}") for case in CASES for target in sorted(case.refused_by)
]


@pytest.mark.parametrize("case, source, target", PAIRS)
def test_pair_is_exact(case, source, target):
    origin = converters.from_spec(case.spec, source)
    if source not in case.no_runtime:
        assert_matches_reference(origin, case.spec)
    source_spec = converters.to_spec(origin)

    converted, report = converters.convert_with_report(origin, target)
    target_spec = converters.to_spec(converted)
    # Portable fields (eps, momentum, flags, mode, tensors bit for bit) survive the trip.
    assert spec_differences(case.spec, target_spec) == []
    assert target_spec.eps == case.spec.eps
    if target not in case.no_runtime:
        assert_matches_reference(converted, case.spec)

    back = converters.convert(converted, source)
    assert spec_differences(source_spec, converters.to_spec(back), ignore=ROUND_TRIP_IGNORED) == []

    layer = report.layers[0]
    assert layer.target_framework == target and layer.layer == case.spec.name
    assert any(t.setting == "eps" for t in layer.translations)
    assert case.spec.name in report.to_json()


@pytest.mark.parametrize("case, target", REFUSALS)
def test_inexpressible_settings_are_refused_with_layer_and_setting(case, target):
    with pytest.raises(NotExpressibleError) as info:
        converters.from_spec(case.spec, target)
    message = str(info.value)
    assert case.spec.name in message
    assert info.value.setting in message and info.value.setting
    assert target in message


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_check_passes_for_every_case(case):
    result = converters.check(case.spec)
    if case.refused_by == set(FRAMEWORKS):
        # Nothing can hold it (LlamaRMSNorm's cast, Gemma's offset): check says so for every target, and never passes.
        assert not result.passed and {t.status for t in result.targets} == {"not_expressible"}, result.render_text()
        return
    assert result.passed, result.render_text()
    statuses = {t.framework: t.status for t in result.targets}
    for framework in FRAMEWORKS:
        expected = (
            "not_expressible"
            if framework in case.refused_by
            else ("skipped",)
            if framework in case.no_runtime
            else ("passed", "skipped")
        )
        assert statuses[framework] in ((expected,) if isinstance(expected, str) else expected), result.render_text()
    assert result.outputs and all(np.isfinite(o.max_abs_error) for o in result.outputs)
