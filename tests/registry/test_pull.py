"""A version comes back as it was registered: pull and run for .pt2, .keras and ONNX, the safetensors state dict, the
structure deduplicated, and tampering refused on the way out.

Real torch, torch.export, Keras on TensorFlow, onnx and onnxruntime; the pulled model's outputs are compared with
the original model's with NumPy (bit for bit), and the ONNX file byte for byte.
"""

from __future__ import annotations

import json
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from registry.service import Registry
from schemas.errors import IntegrityError, RegistryError
from schemas.manifest import ArtifactManifest, canonical_json, sha256_hex


def trained_cnn(seed: int = 0) -> torch.nn.Module:
    """Conv + BatchNorm2d + ReLU whose running statistics moved in two train-mode forwards."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(4, 3, 8, 8))
    return model.eval()


SAMPLE = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)


@pytest.fixture
def registry(tmp_path):
    return Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"), user="test")


def onnx_run(path, sample=SAMPLE) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: sample})[0]


def test_an_onnx_file_comes_back_byte_identical_and_computes_the_same(registry, tmp_path):
    source = tmp_path / "cnn.onnx"
    torch.onnx.export(
        trained_cnn(),
        (torch.from_numpy(SAMPLE),),
        str(source),
        dynamo=False,
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.EVAL,
    )
    registry.register("cnn", source)
    result = registry.pull("cnn@1", tmp_path / "back.onnx")
    back = tmp_path / "back.onnx"
    assert back.read_bytes() == source.read_bytes()
    assert result.format == "onnx" and result.nbytes == source.stat().st_size
    assert np.array_equal(onnx_run(back), onnx_run(source))
    loaded = registry.load("cnn")
    assert isinstance(loaded, onnx.ModelProto) and loaded.SerializeToString() == source.read_bytes()


def test_a_pt2_comes_back_runnable_by_torch_export_load_with_identical_outputs(registry, tmp_path):
    model = trained_cnn()
    source = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(source))
    registry.register("cnn", source)
    source.unlink()  # the registry alone gives it back
    registry.pull("cnn@1", tmp_path / "back.pt2")
    pulled = torch.export.load(
        str(tmp_path / "back.pt2")
    )  # torch's own loader accepts it (the file is ours: no pickle in it)
    with torch.no_grad():
        expected = model(torch.from_numpy(SAMPLE)).numpy()
        got = pulled.module()(torch.from_numpy(SAMPLE)).numpy()
    assert np.array_equal(got, expected)
    program = registry.load("cnn@1")  # through normbridge's safe .pt2 reader
    assert np.array_equal(program.module()(torch.from_numpy(SAMPLE)).detach().numpy(), expected)
    # pulled and registered again, it is the same content
    assert registry.register("cnn", tmp_path / "back.pt2").created is False
    manifest = registry.manifest(
        "cnn@1"
    )  # structure, tensors and the equivalence report: one dump gives what three did
    assert manifest.structure is not None and manifest.equivalence
    assert manifest.digests_and_document() == (
        manifest.digest(),
        manifest.content_digest(),
        manifest.model_dump(mode="json"),
    )


def test_a_keras_model_comes_back_with_safe_mode_and_identical_outputs(registry, tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    x = keras.layers.Dense(5)(inputs)
    x = keras.layers.BatchNormalization(epsilon=1e-3)(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    bn = model.layers[2]
    bn.moving_mean.assign(np.linspace(-1, 1, 5).astype(np.float32))
    bn.moving_variance.assign(np.linspace(0.5, 2, 5).astype(np.float32))
    source = tmp_path / "m.keras"
    model.save(source)
    registry.register("dense", source)
    source.unlink()
    registry.pull("dense@1", tmp_path / "back.keras")
    pulled = keras.saving.load_model(str(tmp_path / "back.keras"), safe_mode=True, compile=False)
    sample = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    assert np.array_equal(np.asarray(pulled(sample, training=False)), np.asarray(model(sample, training=False)))
    assert registry.manifest("dense@1").structure.format == "keras"
    registry.pull("dense@1", tmp_path / "again.keras")  # model.save dates metadata.json and the zip's weights entry
    assert (tmp_path / "again.keras").read_bytes() == (tmp_path / "back.keras").read_bytes()
    with zipfile.ZipFile(
        tmp_path / "back.keras"
    ) as archive:  # dated to the second: two pulls in one second would not show it
        assert {entry.date_time for entry in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert "date_saved" not in json.loads(archive.read("metadata.json"))


def test_the_safetensors_state_dict_loads_strictly_into_a_fresh_instance(registry, tmp_path):
    model = trained_cnn(seed=3)
    registry.register("mod", model)  # an nn.Module through the Python API: its state dict is what is stored
    assert registry.manifest("mod").structure is None
    with pytest.raises(RegistryError, match="--format safetensors"):
        registry.pull("mod", tmp_path / "x.pt2")
    result = registry.pull("mod", tmp_path, "safetensors")
    fresh = trained_cnn(seed=99)
    fresh.load_state_dict(load_file(result.path), strict=True)
    with torch.no_grad():
        assert np.array_equal(fresh(torch.from_numpy(SAMPLE)).numpy(), model(torch.from_numpy(SAMPLE)).numpy())
    with safe_open(result.path, "pt") as handle:
        metadata = handle.metadata()
    assert metadata["format"] == "pt"
    normalizers = json.loads(metadata["normbridge.normalizers"])
    assert [n["path"] for n in normalizers] == ["1"] and normalizers[0]["spec"]["kind"] == "batch"


def test_a_pt2_state_dict_leaves_out_what_the_module_does_not_hold(registry, tmp_path):
    model = trained_cnn(seed=4)
    source = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(source))
    registry.register("cnn", source)
    fresh = trained_cnn(seed=5)
    fresh.load_state_dict(load_file(registry.pull("cnn", tmp_path / "sd.safetensors", "safetensors").path), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_the_safetensors_file_keeps_each_tensor_shape_and_is_the_same_bytes_every_pull(registry, tmp_path):
    """num_batches_tracked is 0-d: written as shape [1], torch's load_state_dict still took it (it broadcasts), so only
    the file's own shapes show it. safetensors writes its metadata from a hash map, in another order each run."""
    model = trained_cnn(seed=6)
    registry.register("mod", model)
    first = registry.pull("mod", tmp_path / "a.safetensors", "safetensors")
    second = registry.pull("mod", tmp_path / "b.safetensors", "safetensors")
    stored = load_file(first.path)
    expected = model.state_dict()
    assert sorted(stored) == sorted(expected)
    for name, tensor in expected.items():
        assert stored[name].shape == tensor.shape and stored[name].dtype == tensor.dtype, name
        assert torch.equal(stored[name], tensor), name
    assert stored["1.num_batches_tracked"].dim() == 0
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert first.digest == second.digest


def _stored_bytes(registry) -> int:
    return sum(registry.store.path_of(d).stat().st_size for d in registry.store.digests())


def test_a_statistics_only_fine_tune_stores_under_one_percent_and_no_structure(registry, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.BatchNorm1d(512), torch.nn.Linear(512, 256)).eval()
    sample = (torch.randn(2, 256),)
    torch.export.save(torch.export.export(model, sample), str(tmp_path / "v1.pt2"))
    registry.register("big", tmp_path / "v1.pt2")
    before = _stored_bytes(registry)
    with torch.no_grad():
        model[1].running_mean.add_(0.25)
        model[1].running_var.mul_(1.5)
    torch.export.save(torch.export.export(model, sample), str(tmp_path / "v2.pt2"))
    registry.register("big", tmp_path / "v2.pt2")
    added = _stored_bytes(registry) - before
    assert 0 < added < 0.01 * before
    one, two = registry.manifest("big@1"), registry.manifest("big@2")
    assert one.structure.parts == two.structure.parts  # the structure is stored once


class OffsetShift(torch.nn.Module):
    """A BatchNorm beside a buffer that is a view into a larger tensor: torch.export.save writes the whole storage."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(3).eval()
        self.register_buffer("shift", torch.arange(5.0)[1:4])

    def forward(self, x):
        return self.norm(x) + self.shift.view(1, 3, 1, 1)


def test_a_payload_holding_more_than_its_tensor_is_stored_as_structure_and_the_rest_rebuilt(registry, tmp_path):
    source = tmp_path / "offset.pt2"
    model = OffsetShift()
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(source))
    with zipfile.ZipFile(source) as archive:
        payloads = {
            name.rsplit("/", 1)[-1]: archive.read(name)
            for name in archive.namelist()
            if "/data/weights/weight_" in name
        }
    larger = [name for name, data in payloads.items() if data == np.arange(5.0, dtype=np.float32).tobytes()]
    assert len(larger) == 1  # the shift's payload is its whole storage: five floats for a three-float view
    registry.register("offset", source)
    kept = {
        name.rsplit("/", 1)[-1] for name in registry.manifest("offset").structure.parts if "/weights/weight_" in name
    }
    assert kept == set(larger)  # every other payload is its tensor's bytes, rebuilt from the tensor
    registry.pull("offset@1", tmp_path / "back.pt2")
    with zipfile.ZipFile(tmp_path / "back.pt2") as archive:
        back = {
            name.rsplit("/", 1)[-1]: archive.read(name)
            for name in archive.namelist()
            if "/data/weights/weight_" in name
        }
    assert back == payloads
    with torch.no_grad():
        expected = model(torch.from_numpy(SAMPLE)).numpy()
        assert np.array_equal(
            torch.export.load(str(tmp_path / "back.pt2")).module()(torch.from_numpy(SAMPLE)).numpy(), expected
        )


def test_a_tampered_structure_blob_is_refused_on_the_way_out(registry, tmp_path):
    source = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(trained_cnn(), (torch.from_numpy(SAMPLE),)), str(source))
    registry.register("cnn", source)
    ref = registry.manifest("cnn").structure.parts["models/model.json"]
    path = registry.store.path_of(ref.digest)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01  # one bit of the program's JSON
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="structure:models/model.json"):
        registry.pull("cnn", tmp_path / "out.pt2")
    assert not (tmp_path / "out.pt2").exists()
    assert any(p.tensor == "structure:models/model.json" for p in registry.verify("cnn", rerun_checks=False).problems)


def test_a_manifest_without_structure_keeps_its_document_and_digest():
    document = {"framework": "torch", "format": "torch-module", "mode": "eval", "tensors": {}, "normalizers": []}
    manifest = ArtifactManifest.model_validate(document)
    assert "structure" not in json.loads(manifest.to_canonical_json())
    assert "structure" not in manifest.model_dump(mode="json")
    fields = {
        "framework",
        "format",
        "mode",
        "tensors",
        "normalizers",
    }  # what the content digest covered before structures
    assert manifest.content_digest() == sha256_hex(
        canonical_json(manifest.model_dump(mode="json", include=fields)).encode()
    )


def test_a_manifest_naming_a_structure_part_outside_its_folder_or_not_bytes_is_refused():
    from schemas.errors import SpecError
    from schemas.manifest import load_manifest

    ref = {"digest": "0" * 64, "dtype": "uint8", "shape": [3], "nbytes": 3, "role": "weight"}
    base = {"framework": "onnx", "format": "onnx", "mode": "eval", "tensors": {}, "normalizers": []}
    for part, entry in (
        ("../model.onnx", ref),
        ("/etc/passwd", ref),
        ("model.onnx", {**ref, "dtype": "float32", "shape": [3], "nbytes": 12}),
    ):
        with pytest.raises(SpecError, match="structure part"):
            load_manifest({**base, "structure": {"format": "onnx", "parts": {part: entry}}})
    assert load_manifest({**base, "structure": {"format": "onnx", "parts": {"model.onnx": ref}}}).blob_digests() == [
        "0" * 64
    ]


def test_an_onnx_file_read_from_memory_may_not_point_at_external_data(tmp_path):
    from converters.onnx_adapter.files import load_onnx_bytes
    from schemas.errors import InputFileError

    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["w"], ["y"])],
            "g",
            [],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
            [onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])],
        )
    )
    assert load_onnx_bytes(model.SerializeToString(), tmp_path / "m.onnx").graph.initializer[0].name == "w"
    tensor = model.graph.initializer[0]
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="../../secret.bin")
    with pytest.raises(InputFileError, match="external file"):
        load_onnx_bytes(model.SerializeToString(), tmp_path / "m.onnx")
