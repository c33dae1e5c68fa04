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
    assert [r.name for r in recognizers.of("torch", ObjectRecognizer)] == [
        "torch.computed",
        "torch.modules",
        "torch.aten_ops",
        "tests.whitening",
    ]


def test_a_duplicate_recognizer_raises_and_a_missing_one_lists_the_registered():
    from converters.keras_adapter.recognizers.layers import KerasLayers
    from converters.recognizers import RecognizerRegistry

    recognizers = RecognizerRegistry()
    with pytest.raises(DuplicateAdapterError, match="'keras.layers' is already registered"):
        recognizers.register(KerasLayers())
    with pytest.raises(AdapterNotFoundError, match="currently registered recognizers are .*onnx.moments"):
        recognizers.get("onnx.whitening")


def test_a_framework_s_stock_recognizers_are_the_ones_its_adapter_package_lists():
    """converters.recognizers names no framework: it asks each adapter package's `recognizers/` for its own, in
    order."""
    from converters.recognizers import ObjectRecognizer, RecognizerRegistry

    recognizers = RecognizerRegistry({"keras": "converters.keras_adapter", "torch": "tests.buggy_torch"})
    keras = [r.name for r in recognizers.of("keras", ObjectRecognizer)]
    assert keras == ["keras.layers", "keras.standardization", "keras.probed"]
    assert recognizers.of("torch", ObjectRecognizer) == []  # a package without recognizers/ has none
    assert recognizers.of("onnx", ObjectRecognizer) == []  # a framework the registry was not given has none


@pytest.mark.parametrize("framework", REGISTRY.framework_names)
def test_each_stock_recognizer_is_named_after_its_framework_and_its_module(framework):
    """The recognizer `<framework>.<name>` is `<framework>_adapter/recognizers/<name>.py`: a name in a message finds
    its file."""
    from converters.recognizers import RECOGNIZERS, Recognizer, stock_recognizers

    modules = stock_recognizers(REGISTRY.packages[framework])
    assert modules and [r.name for r in RECOGNIZERS.of(framework, Recognizer)][: len(modules)] == [
        f"{framework}.{module.rsplit('.', 1)[1]}" for module in modules
    ]
