"""Artifacts: extraction from torch modules, .pt2, Keras and ONNX; digests; folders; bad input refused."""

from __future__ import annotations

import json
import pickle

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import converters
from registry.manifest_io import (
    BLOBS_DIR,
    MANIFEST_FILE,
    load_artifact_folder,
    save_artifact_folder,
    specs_from_manifest,
    tensors_from_blobs,
)
from registry.artifact import extract_artifact
from schemas import InputFileError, SpecError
from schemas.manifest import Lineage, load_manifest, sha256_hex


class SmallCNN(torch.nn.Module):
    """Conv + BatchNorm body and a LayerNorm head."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))

    def forward(self, x):
        return self.head(self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1))


def trained_cnn(seed: int = 0) -> SmallCNN:
    torch.manual_seed(seed)
    model = SmallCNN().train()
    for _ in range(3):
        model(torch.randn(4, 3, 8, 8))
    return model.eval()


def test_torch_module_every_state_dict_tensor_and_the_normalizer_mapping():
    model = trained_cnn()
    artifact = extract_artifact(model)
    manifest = artifact.manifest
    state = model.state_dict()
    assert set(manifest.tensors) == set(state)
    assert (manifest.framework, manifest.format, manifest.mode) == ("torch", "torch-module", "eval")
    assert [entry.path for entry in manifest.normalizers] == ["bn", "head.0"]
    assert manifest.normalizers[0].tensors == {
        "scale": "bn.weight",
        "bias": "bn.bias",
        "running_mean": "bn.running_mean",
        "running_var": "bn.running_var",
        "num_batches_tracked": "bn.num_batches_tracked",
    }
    assert manifest.normalizers[1].tensors == {"scale": "head.0.weight", "bias": "head.0.bias"}
    assert manifest.tensors["bn.running_var"].role == "running_var" and manifest.tensors["conv.weight"].role == "weight"
    assert manifest.lineage == Lineage(parent=None, operation="registered")
    # every tensor read back from its blob is bit-identical to the state_dict entry
    arrays = tensors_from_blobs(manifest, artifact.blobs.__getitem__)
    for name, tensor in state.items():
        np.testing.assert_array_equal(arrays[name], tensor.numpy())
        assert arrays[name].dtype == tensor.numpy().dtype and arrays[name].shape == tuple(tensor.shape)
    assert all(sha256_hex(data) == digest for digest, data in artifact.blobs.items())
    # the specs rebuilt from the manifest equal those read from the layers
    rebuilt = specs_from_manifest(manifest, artifact.blobs.__getitem__)
    assert rebuilt == artifact.specs
    assert rebuilt[0].eps == 1e-5 and int(rebuilt[0].tensors["num_batches_tracked"]) == 3


def test_exported_program_file_holds_the_same_tensor_bytes_as_the_module(tmp_path):
    model = trained_cnn()
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 3, 8, 8),)), str(path))
    from_module = extract_artifact(model).manifest
    from_file = extract_artifact(path).manifest
    assert from_file.format == "pt2" and from_file.mode == "eval"
    assert [e.path for e in from_file.normalizers] == ["bn", "head.0"]
    assert from_file.normalizers[0].tensors["running_var"] == "bn.running_var"
    for name, ref in from_module.tensors.items():
        assert from_file.tensors[name].digest == ref.digest, name


def test_keras_model_and_its_file_map_variable_paths(tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            keras.layers.Conv2D(4, 3),
            keras.layers.BatchNormalization(epsilon=1e-3),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.LayerNormalization(),
            keras.layers.Dense(2),
        ]
    )
    model(np.random.default_rng(0).normal(size=(2, 6, 6, 3)).astype("float32"), training=True)
    artifact = extract_artifact(model)
    manifest = artifact.manifest
    assert manifest.framework == "keras" and manifest.format == "keras"
    assert set(manifest.tensors) == {v.path.removeprefix(f"{model.name}/") for v in model.weights}
    bn = manifest.normalizers[0]
    assert (
        bn.spec["eps"] == 1e-3
        and bn.tensors["running_var"].endswith("/moving_variance")
        and bn.tensors["scale"].endswith("/gamma")
    )
    arrays = tensors_from_blobs(manifest, artifact.blobs.__getitem__)
    variable = next(v for v in model.weights if v.path.endswith(bn.tensors["running_mean"]))
    np.testing.assert_array_equal(arrays[bn.tensors["running_mean"]], variable.numpy())
    path = tmp_path / "model.keras"
    model.save(path)
    from_file = extract_artifact(path).manifest
    assert [e.path for e in from_file.normalizers] == [e.path for e in manifest.normalizers]
    assert {n: r.digest for n, r in from_file.tensors.items()} == {n: r.digest for n, r in manifest.tensors.items()}


def test_onnx_native_nodes_map_to_initializers_and_extra_state_is_stored(tmp_path):
    bn = torch.nn.BatchNorm2d(3, eps=1e-3)
    bn.train()
    bn(torch.randn(4, 3, 5, 5))
    bn.eval()
    onnx_model = converters.convert(bn, to="onnx", opset=23)
    path = tmp_path / "bn.onnx"
    onnx.save(onnx_model, path)
    manifest = extract_artifact(path).manifest
    assert manifest.framework == "onnx" and manifest.mode == "eval"
    (entry,) = manifest.normalizers
    initializers = {i.name for i in onnx_model.graph.initializer}
    for spec_name in ("scale", "bias", "running_mean", "running_var"):
        assert entry.tensors[spec_name] in initializers
    assert entry.spec["eps"] == 1e-3
    # ONNX holds no num_batches_tracked tensor: it is kept as an extra tensor of the normalizer
    extra = entry.tensors["num_batches_tracked"]
    assert extra == f"{entry.path}::num_batches_tracked" and manifest.tensors[extra].role == "num_batches_tracked"


def test_onnx_export_of_the_cnn_reads_the_layernorm_node():
    model = trained_cnn()
    program = torch.onnx.export(
        model, (torch.randn(2, 3, 8, 8),), dynamo=True, opset_version=23, external_data=False, verbose=False
    )
    manifest = extract_artifact(program.model_proto).manifest
    layer_norms = [e for e in manifest.normalizers if e.spec["kind"] == "layer"]
    assert len(layer_norms) == 1
    assert (
        manifest.tensors[layer_norms[0].tensors["scale"]].digest
        == extract_artifact(model).manifest.tensors["head.0.weight"].digest
    )


def test_content_digest_is_stable_and_moves_with_one_running_var_value():
    model = trained_cnn()
    first, second = extract_artifact(model).manifest, extract_artifact(model).manifest
    assert first.content_digest() == second.content_digest() and first.digest() == second.digest()
    # lineage and notes are not content
    relabelled = first.model_copy(update={"lineage": Lineage(parent="cnn@1", operation="fine-tuned"), "note": "x"})
    assert relabelled.content_digest() == first.content_digest() and relabelled.digest() != first.digest()
    with torch.no_grad():
        model.bn.running_var[2] += 1e-3
    changed = extract_artifact(model).manifest
    assert changed.content_digest() != first.content_digest()
    assert [n for n in first.tensors if first.tensors[n].digest != changed.tensors[n].digest] == ["bn.running_var"]


def test_artifact_folder_round_trip_and_import(tmp_path):
    artifact = extract_artifact(trained_cnn())
    folder = save_artifact_folder(artifact, tmp_path / "art")
    loaded = load_artifact_folder(folder)
    assert loaded.manifest == artifact.manifest and loaded.blobs == artifact.blobs and loaded.specs == artifact.specs
    imported = extract_artifact(folder)
    assert imported.manifest.lineage.operation == "imported"
    assert imported.manifest.content_digest() == artifact.manifest.content_digest()


# -- bad input ------------------------------------------------------------------------------


def test_corrupted_blob_in_an_artifact_folder_is_refused(tmp_path):
    folder = save_artifact_folder(extract_artifact(trained_cnn()), tmp_path / "art")
    blob = sorted((folder / BLOBS_DIR).iterdir())[0]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match="corrupted or modified"):
        extract_artifact(folder)
    # bytes that hash to their name but are not a safetensors tensor
    garbage = b"not safetensors at all"
    digest = sha256_hex(garbage)
    (folder / BLOBS_DIR / f"{digest}.safetensors").write_bytes(garbage)
    blob.unlink()
    document = json.loads((folder / MANIFEST_FILE).read_text())
    for ref in document["tensors"].values():
        if ref["digest"] == blob.stem:
            ref["digest"] = digest
    (folder / MANIFEST_FILE).write_text(json.dumps(document))
    with pytest.raises(InputFileError, match="not valid single-tensor safetensors"):
        load_artifact_folder(folder)


def test_manifest_failing_its_schema_is_refused(tmp_path):
    folder = save_artifact_folder(extract_artifact(trained_cnn()), tmp_path / "art")
    document = json.loads((folder / MANIFEST_FILE).read_text())
    document["mode"] = "sometimes"
    (folder / MANIFEST_FILE).write_text(json.dumps(document))
    with pytest.raises(SpecError, match="mode"):
        load_artifact_folder(folder)
    document["mode"] = "eval"
    document["normalizers"][0]["tensors"]["running_var"] = "no.such.tensor"
    with pytest.raises(SpecError, match="no.such.tensor"):
        load_manifest(document)
    with pytest.raises(SpecError, match="schema_version"):
        load_manifest({**document, "schema_version": 99})


def test_nan_running_statistics_are_refused_naming_the_layer():
    model = trained_cnn()
    with torch.no_grad():
        model.bn.running_mean[0] = float("nan")
    with pytest.raises(SpecError) as caught:
        extract_artifact(model)
    assert caught.value.layer == "bn" and caught.value.setting == "running_mean"
    assert str(caught.value).startswith("layer 'bn', setting 'running_mean': ") and "NaN" in str(caught.value)


def test_onnx_file_failing_the_checker_is_refused(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["undefined_input"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), path)
    with pytest.raises(InputFileError, match="not a valid ONNX model"):
        extract_artifact(path)


def test_pickle_and_keras_lambda_are_refused(tmp_path):
    import keras

    pickled = tmp_path / "model.pt"
    pickled.write_bytes(pickle.dumps({"state": 1}))
    with pytest.raises(InputFileError, match="pickle"):
        extract_artifact(pickled)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Lambda(lambda x: x * 2.0), keras.layers.BatchNormalization()]
    )
    path = tmp_path / "lambda.keras"
    model.save(path)
    with pytest.raises(InputFileError, match="Lambda"):
        extract_artifact(path)


def test_a_bare_normalization_layer_maps_to_its_unprefixed_state_dict_keys():
    manifest = extract_artifact(torch.nn.BatchNorm1d(5)).manifest
    (entry,) = manifest.normalizers
    assert entry.tensors == {
        "scale": "weight",
        "bias": "bias",
        "running_mean": "running_mean",
        "running_var": "running_var",
        "num_batches_tracked": "num_batches_tracked",
    }
    assert set(manifest.tensors) == set(torch.nn.BatchNorm1d(5).state_dict())


def test_mode_follows_the_normalizers():
    model = trained_cnn()
    assert extract_artifact(model.train()).manifest.mode == "train"
    model.bn.eval()
    assert extract_artifact(model).manifest.mode == "mixed"
    assert extract_artifact(torch.nn.Linear(2, 2)).manifest.mode == "n/a"
