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


@pytest.mark.slow
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


# -- recognizers -------------------------------------------------------------------------------


def test_a_registered_recognizer_is_asked_after_the_stock_ones():
    import torch

    from converters.recognizers import ObjectRecognizer, RecognizerRegistry

    class Whitening(torch.nn.Module):  # not a stock class: no stock recognizer knows it
        pass

    class WhiteningAsLayer(ObjectRecognizer):
        name = "tests.whitening"
        framework = "torch"

        def kind_of(self, obj):
            return "layer" if isinstance(obj, Whitening) else None

    recognizers = RecognizerRegistry()
    assert recognizers.kind_of("torch", Whitening()) is None
    recognizers.register(WhiteningAsLayer())
    assert recognizers.kind_of("torch", Whitening()) == "layer"
    assert recognizers.kind_of("torch", torch.nn.BatchNorm2d(3)) == "batch"  # the stock ones still answer first
    assert [r.name for r in recognizers.of("torch", ObjectRecognizer)] == ["torch.computed", "torch.modules", "torch.aten_ops", "tests.whitening"]


def test_a_duplicate_recognizer_raises_and_a_missing_one_lists_the_registered():
    from converters.recognizers import RecognizerRegistry
    from converters.recognizers.keras_layers import KerasLayers

    recognizers = RecognizerRegistry()
    with pytest.raises(DuplicateAdapterError, match="'keras.layers' is already registered"):
        recognizers.register(KerasLayers())
    with pytest.raises(AdapterNotFoundError, match="currently registered recognizers are .*onnx.moments"):
        recognizers.get("onnx.whitening")
