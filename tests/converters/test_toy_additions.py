"""A sixth kind and a fourth framework, each added from test-only files (tests/toy/) through the public hooks alone.

The kind, ScaleNorm, has no native ONNX op and no stock class anywhere: it is refused by name where no adapter holds
it, and checked against its reference where one does. The framework, toynp, is pure NumPy: layers convert to it and
from it through the spec, and `check` runs it with the others. Each test restores the registries it changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import converters
from converters import reference
from converters.adapters import REGISTRY
from schemas import KINDS, NormSpec, NotExpressibleError
from schemas.kinds import KIND_INFO
from schemas.vocabulary import spec_frameworks
from tests.toy import scalenorm_kind, scalenorm_reference

TOY = Path(__file__).resolve().parents[1] / "toy"


def _forget_toy_modules() -> None:
    for name in [
        name for name in sys.modules if name == "toynp" or name.startswith(("toynp.", "tests.toy.toynp_adapter"))
    ]:
        del sys.modules[name]


@pytest.fixture
def scalenorm():
    """The toy kind, added for one test and taken out after it."""
    REGISTRY.add_kind(scalenorm_kind, scalenorm_reference)
    try:
        yield "scalenorm"
    finally:
        REGISTRY.remove_kind("scalenorm")
    assert "scalenorm" not in KIND_INFO and "scalenorm" not in reference.KIND_MODULES


@pytest.fixture
def toynp(scalenorm, monkeypatch):
    """The toy framework (after the toy kind, so its package finds its ScaleNorm module), for one test."""
    monkeypatch.syspath_prepend(str(TOY))  # toynp is a top-level package, as torch is
    from tests.toy.toynp_adapter import INFO

    REGISTRY.register_framework(INFO)
    try:
        yield __import__("toynp")
    finally:
        REGISTRY.remove_framework("toynp")
        _forget_toy_modules()
    assert "toynp" not in REGISTRY.framework_names and "toynp" not in spec_frameworks()


def scalenorm_spec(**changes) -> NormSpec:
    rng = np.random.default_rng(0)
    fields = dict(
        name="sn",
        kind="scalenorm",
        normalized_shape=(6,),
        eps=1e-5,
        bias=False,
        source={"framework": "spec"},
        tensors={"scale": rng.normal(size=6).astype(np.float32)},
    )
    return NormSpec(**{**fields, **changes})


def test_the_toy_kind_is_known_while_added_and_refused_by_name_where_no_adapter_holds_it(scalenorm):
    spec = scalenorm_spec()
    assert KIND_INFO["scalenorm"].onnx_op is None and KIND_INFO["scalenorm"].stock_classes("torch") == ()
    for target in ("torch", "keras", "onnx"):
        with pytest.raises(NotExpressibleError, match="scalenorm"):
            converters.from_spec(spec, target)
    result = converters.check(spec)
    assert [(t.framework, t.status) for t in result.targets] == [
        ("torch", "not_expressible"),
        ("keras", "not_expressible"),
        ("onnx", "not_expressible"),
    ]
    assert all("scalenorm" in t.reason for t in result.targets)


def test_a_spec_of_an_unknown_kind_is_refused_once_the_toy_kind_is_taken_out():
    REGISTRY.add_kind(scalenorm_kind, scalenorm_reference)
    REGISTRY.remove_kind("scalenorm")
    with pytest.raises(ValueError, match="Input should be 'batch'"):
        scalenorm_spec()
    assert tuple(KIND_INFO) == KINDS


def test_a_torch_layernorm_converts_to_the_toy_framework_and_back_through_the_spec(toynp):
    torch.manual_seed(0)
    module = torch.nn.LayerNorm(6, eps=1e-4).eval()
    with torch.no_grad():
        module.weight.normal_()
        module.bias.normal_()
    toy = converters.convert(module, to="toynp")
    assert isinstance(toy, toynp.LayerNorm)
    x = np.random.default_rng(1).normal(size=(3, 6)).astype(np.float32)
    spec = converters.to_spec(module)
    np.testing.assert_allclose(toy(x), reference.forward(spec, x), rtol=1e-5, atol=1e-5)  # the oracle, not torch
    back = converters.convert(toy, to="torch")
    assert torch.equal(back.weight, module.weight) and torch.equal(back.bias, module.bias) and back.eps == module.eps
    assert converters.to_spec(toy).source.framework == "toynp"


def test_check_runs_the_toy_framework_with_the_stock_ones(toynp):
    torch.manual_seed(0)
    result = converters.check(torch.nn.LayerNorm(6).eval())
    assert [t.framework for t in result.targets] == ["torch", "keras", "onnx", "toynp"]
    assert result.passed, result.render_text()


def test_the_toy_kind_converts_and_checks_in_the_toy_framework_alone(toynp):
    toy = toynp.ScaleNorm(6, eps=1e-5, weight=np.linspace(0.5, 1.5, 6), name="sn")
    spec = converters.to_spec(toy)
    assert spec.kind == "scalenorm" and spec.source.framework == "toynp"
    result = converters.check(spec)
    assert {t.framework: t.status for t in result.targets} == {
        "torch": "not_expressible",
        "keras": "not_expressible",
        "onnx": "not_expressible",
        "toynp": "passed",
    }
    assert result.passed, result.render_text()
    with pytest.raises(NotExpressibleError, match="onnx has no scalenorm layer"):
        converters.convert(toy, to="onnx")
