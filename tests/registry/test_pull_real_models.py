"""Models nobody here wrote come back from the registry as they went in (issue 14), not only the project's own CNNs.

A transformers Llama (tiny config, random state, no hub) saved as a `.pt2`, and a keras.applications MobileNet
(weights=None, 32x32, alpha 0.25) saved as a `.keras` file: registered, the source file deleted, pulled and run with
outputs bit-identical to the original model's, loaded through the registry's safe readers, exported for serving from
the registry alone (onnxruntime against the original), with the servable verdict each should get, read from the
model itself: the Llama holds no running statistics (nothing to record), the MobileNet has one BatchNorm left at its
initial statistics (never_trained there and nowhere else).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

from registry.service import Registry
from tests import real_norms as R
from tests.cli_run import invoke_cli

pytestmark = (
    pytest.mark.slow
)  # real models: a transformers import, a Keras model, two registrations and two serving exports


@pytest.fixture
def registry(tmp_path):
    registry = Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"), user="test")
    yield registry
    registry.meta.close()


def export_from_registry(registry, ref: str, tmp_path) -> tuple[dict, ort.InferenceSession]:
    """`normbridge export NAME@REF --to onnx` on the registry alone (in this process):
    its JSON and a session on the file."""
    done = invoke_cli(
        "export",
        ref,
        "--to",
        "onnx",
        "-o",
        "served.onnx",
        "--db",
        registry.db_url,
        "--blobs",
        registry.blob_uri,
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["written"] and result["contract"]["passed"]
    return result, ort.InferenceSession(str(tmp_path / "served.onnx"), providers=["CPUExecutionProvider"])


def test_a_transformers_llama_pt2_comes_back_runnable_and_identical(registry, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = R.randomise(R.llama())
        model.config.use_cache = False
        ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))
        source = tmp_path / "llama.pt2"
        torch.export.save(torch.export.export(model, (ids,)), str(source))
        with torch.no_grad():
            expected = model(ids).last_hidden_state.numpy()
    assert not any(hasattr(m, "running_mean") for m in model.modules())  # RMSNorms only: no statistics to judge
    version = registry.register("llama", source).version
    assert (version.servable, version.hazards, version.structure_checked) == (True, [], True)
    source.unlink()

    result = registry.pull("llama@1", tmp_path / "back.pt2")
    pulled = torch.export.load(result.path)  # torch's own loader: the file holds no pickle
    with torch.no_grad():
        assert np.array_equal(pulled.module()(ids)["last_hidden_state"].numpy(), expected)
        assert np.array_equal(
            registry.load("llama@1").module()(ids)["last_hidden_state"].numpy(), expected
        )  # normbridge's reader
    assert registry.register("llama", tmp_path / "back.pt2").created is False  # the same content

    exported, session = export_from_registry(registry, "llama@1", tmp_path)
    assert exported["hazards"] == []
    served = session.run(None, {session.get_inputs()[0].name: ids.numpy()})[0]
    np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)


def test_a_keras_applications_mobilenet_comes_back_runnable_and_identical_with_its_verdict(registry, tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNet(input_shape=(32, 32, 3), alpha=0.25, weights=None, classes=10)
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    rng = np.random.default_rng(0)
    for layer in norms[:-1]:  # random statistics everywhere but the last BatchNorm, left as Keras built it
        c = layer.moving_mean.shape[0]
        layer.moving_mean.assign(rng.normal(0, 0.2, c).astype(np.float32))
        layer.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype(np.float32))
    untouched = [
        layer.name
        for layer in norms
        if not np.any(layer.moving_mean.numpy()) and np.all(layer.moving_variance.numpy() == 1)
    ]
    assert untouched == [norms[-1].name]
    source = tmp_path / "mobilenet.keras"
    model.save(source)
    sample = rng.standard_normal((2, 32, 32, 3)).astype(np.float32)
    expected = np.asarray(model(sample, training=False))

    version = registry.register("mobilenet", source).version
    assert version.servable is False and version.structure_checked is True
    assert [(h["code"], h["layer"], h["blocking"]) for h in version.hazards] == [
        ("never_trained", name, True) for name in untouched
    ]
    source.unlink()

    result = registry.pull("mobilenet@1", tmp_path / "back.keras")
    pulled = keras.saving.load_model(result.path, safe_mode=True, compile=False)
    assert np.array_equal(np.asarray(pulled(sample, training=False)), expected)
    assert np.array_equal(np.asarray(registry.load("mobilenet@1")(sample, training=False)), expected)

    exported, session = export_from_registry(registry, "mobilenet@1", tmp_path)  # a warning, not a refusal
    assert [(h["layer"], h["code"]) for h in exported["hazards"]] == [(name, "never_trained") for name in untouched]
    served = session.run(None, {session.get_inputs()[0].name: sample})[0]
    np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)
