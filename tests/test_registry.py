"""The adapter registry: complete coverage, duplicates refused, missing pairs listed."""

from __future__ import annotations

import pytest

from converters.adapters import REGISTRY, AdapterRegistry
from converters.torch_adapter import KIND_ADAPTERS
from schemas import FRAMEWORKS, KINDS, AdapterNotFoundError, DuplicateAdapterError, UnsupportedObjectError


def test_every_framework_has_an_adapter_for_every_kind():
    assert REGISTRY.pairs() == sorted((f, k) for f in FRAMEWORKS for k in KINDS)


def test_a_duplicate_registration_raises():
    registry = AdapterRegistry({})
    registry.add(KIND_ADAPTERS["batch"]())
    with pytest.raises(DuplicateAdapterError, match="already registered"):
        registry.add(KIND_ADAPTERS["batch"]())


def test_a_missing_pair_lists_what_is_available():
    registry = AdapterRegistry({"torch": "converters.torch_adapter"})
    registry.framework("torch")
    with pytest.raises(AdapterNotFoundError, match="currently registered pairs are .*torch/batch"):
        registry.get("torch", "whitening")
    with pytest.raises(AdapterNotFoundError, match="currently registered frameworks are torch"):
        registry.get("jax", "batch")


def test_an_unknown_object_is_refused_with_what_was_expected():
    with pytest.raises(UnsupportedObjectError, match="expected a torch.nn.Module, a Keras layer or an onnx.ModelProto"):
        REGISTRY.framework_of(object())


def test_converting_a_torch_layer_does_not_import_tensorflow():
    import subprocess
    import sys

    code = (
        "import sys, torch, converters\n"
        "converters.to_spec(torch.nn.LayerNorm(3))\n"
        "converters.from_spec(converters.to_spec(torch.nn.LayerNorm(3)), 'torch')\n"
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'keras imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_whole_model_tool_is_reachable_from_the_package():
    import converters

    for name in converters._MODEL_TOOLS:
        assert callable(getattr(converters, name)), name
