"""A structure is checked once, at registration, and `pull` then writes the file straight to disk without reading it
back.

Real .pt2 and ONNX files, real torch.export.load, onnxruntime, a real local blob folder and a real S3 API (moto
server). A structure no safe reader accepts (a .pt2 carrying AOTInductor code, an ONNX graph that is not protobuf)
arrives in a bundle or an artifact folder and is refused at registration with nothing stored; a pull that meets a
tampered blob, or a rebuilt file that is not the registered one, leaves no file and no temporary sibling behind.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sqlalchemy import text

from registry.artifact import extract_artifact
from registry.client_transfer import folder_tar_chunks
from registry.manifest_io import save_artifact_folder
from registry.service import Registry
from registry.tensor_blobs import tensor_blob
from schemas.errors import InputFileError, IntegrityError
from schemas.manifest import sha256_hex
from tests import moto_server
from tests.registry.test_pull import SAMPLE, onnx_run, trained_cnn

moto_s3 = moto_server.moto_s3
s3_env = moto_server.s3_env

NO_LIMIT = 1 << 40


@pytest.fixture
def registry(tmp_path):
    registry = Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"), user="test")
    yield registry
    registry.meta.close()


@pytest.fixture(scope="module")
def pt2_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "cnn.pt2"
    torch.export.save(torch.export.export(trained_cnn(), (torch.from_numpy(SAMPLE),)), str(path))
    return path


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "cnn.onnx"
    torch.onnx.export(
        trained_cnn(),
        (torch.from_numpy(SAMPLE),),
        str(path),
        dynamo=False,
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.EVAL,
    )
    return path


def bundle(folder: Path) -> io.BytesIO:
    """The bundle exactly as `normbridge --server URL register FOLDER` sends it."""
    return io.BytesIO(b"".join(folder_tar_chunks(folder, lambda done: None)))


def with_part(folder: Path, name: str, data: bytes) -> Path:
    """`folder` with the structure part `name` set to `data` (its blob written, the manifest pointing at it)."""
    blob = tensor_blob(np.frombuffer(data, dtype=np.uint8))
    digest = sha256_hex(blob)
    (folder / "blobs" / f"{digest}.safetensors").write_bytes(blob)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["structure"]["parts"][name] = {
        "digest": digest,
        "dtype": "uint8",
        "shape": [len(data)],
        "nbytes": len(data),
        "role": "weight",
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_a_registered_file_is_checked_by_its_own_reader_and_pulls_without_a_read_back(registry, pt2_file, tmp_path):
    version = registry.register("cnn", pt2_file).version
    assert version.structure_checked is True and registry.show("cnn@1").structure_checked is True
    result = registry.pull("cnn@1", tmp_path / "back.pt2")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary sibling left
    with torch.no_grad():
        got = torch.export.load(result.path).module()(torch.from_numpy(SAMPLE)).numpy()
        assert np.array_equal(got, trained_cnn()(torch.from_numpy(SAMPLE)).numpy())
    assert (
        result.digest == sha256_hex((tmp_path / "back.pt2").read_bytes())
        and result.nbytes == (tmp_path / "back.pt2").stat().st_size
    )
    assert registry.model_file("cnn@1").digest == sha256_hex(registry.model_file("cnn@1").data)
    assert (
        registry.register("mod", trained_cnn()).version.structure_checked is None
    )  # an nn.Module: no structure to check


def test_a_bundle_or_folder_structure_is_checked_at_registration_and_then_pulls_the_same(
    registry, pt2_file, onnx_file, tmp_path
):
    folder = save_artifact_folder(extract_artifact(pt2_file), tmp_path / "pt2-artifact")
    streamed = registry.register_stream("cnn", bundle(folder), NO_LIMIT)
    assert streamed.created and streamed.version.structure_checked is True
    registry.pull("cnn@1", tmp_path / "back.pt2")
    with torch.no_grad():
        got = torch.export.load(str(tmp_path / "back.pt2")).module()(torch.from_numpy(SAMPLE)).numpy()
        assert np.array_equal(got, trained_cnn()(torch.from_numpy(SAMPLE)).numpy())
    folder = save_artifact_folder(extract_artifact(onnx_file), tmp_path / "onnx-artifact")
    assert registry.register("net", folder).version.structure_checked is True
    registry.pull("net@1", tmp_path / "back.onnx")
    assert (tmp_path / "back.onnx").read_bytes() == onnx_file.read_bytes()


@pytest.mark.parametrize("case", ["pt2 with AOTInductor code", "onnx graph that is not protobuf"])
def test_a_structure_no_safe_reader_accepts_is_refused_at_registration(registry, pt2_file, onnx_file, tmp_path, case):
    if case.startswith("pt2"):  # native code torch.export.load would hand to AOTInductor: normbridge never loads it
        folder = with_part(
            save_artifact_folder(extract_artifact(pt2_file), tmp_path / "a"),
            "data/aotinductor/model/model.so",
            b"\x7fELF",
        )
        reason = "compiled code for another runtime"
    else:
        folder = with_part(
            save_artifact_folder(extract_artifact(onnx_file), tmp_path / "a"), "model.onnx", b"\xff\xff not a protobuf"
        )
        reason = "not an ONNX protobuf"
    with pytest.raises(InputFileError, match=f"does not load back through normbridge's safe reader.*{reason}"):
        registry.register_stream("bad", bundle(folder), NO_LIMIT)
    with pytest.raises(InputFileError, match=reason):
        registry.register("bad", folder)
    assert registry.models() == []
    assert [e.action for e in registry.audit()] == ["register_failed", "register_failed"]


def test_a_version_registered_before_the_check_was_recorded_is_read_back_and_pulls_the_same(
    registry, onnx_file, tmp_path
):
    registry.register("net", onnx_file)
    with registry.meta.engine.begin() as connection:
        connection.execute(text("UPDATE versions SET structure_checked = NULL"))
    assert registry.show("net@1").structure_checked is None
    result = registry.pull("net@1", tmp_path / "back.onnx")
    assert (tmp_path / "back.onnx").read_bytes() == onnx_file.read_bytes() and result.digest == sha256_hex(
        onnx_file.read_bytes()
    )
    assert np.array_equal(onnx_run(tmp_path / "back.onnx"), onnx_run(onnx_file))


def test_a_pull_that_meets_a_tampered_tensor_leaves_the_old_file_and_no_temporary(registry, pt2_file, tmp_path):
    registry.register("cnn", pt2_file)
    target = tmp_path / "out" / "cnn.pt2"
    target.parent.mkdir()
    target.write_bytes(b"the previous file")
    weight = next(
        ref for name, ref in registry.manifest("cnn").tensors.items() if name.endswith("weight") and len(ref.shape) == 4
    )
    path = registry.store.path_of(weight.digest)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="tampered"):
        registry.pull("cnn", target)
    assert target.read_bytes() == b"the previous file" and [p.name for p in target.parent.iterdir()] == ["cnn.pt2"]


def test_an_onnx_file_that_is_not_the_registered_one_is_not_written(registry, onnx_file, tmp_path):
    registry.register("net", onnx_file)
    with registry.meta.engine.begin() as connection:  # the recorded digest no longer matches what the blobs rebuild
        manifest = json.loads(connection.execute(text("SELECT manifest FROM versions")).scalar_one())
        manifest["structure"]["file_digest"] = "0" * 64
        connection.execute(text("UPDATE versions SET manifest = :m"), {"m": json.dumps(manifest)})
    with pytest.raises(IntegrityError, match="not the 000000000000 registered"):
        registry.pull("net@1", tmp_path / "back.onnx")
    assert list(tmp_path.glob("*back.onnx*")) == []


def test_a_pull_from_s3_streams_each_blob_through_its_hash(s3_env, onnx_file, tmp_path):
    _, bucket, client = s3_env
    registry = Registry(db=f"sqlite:///{tmp_path / 's3.db'}", blobs=f"s3://{bucket}/nb", user="test")
    registry.register("net", onnx_file)
    registry.pull("net@1", tmp_path / "back.onnx")
    assert (tmp_path / "back.onnx").read_bytes() == onnx_file.read_bytes()
    weight = next(ref for name, ref in registry.manifest("net").tensors.items() if len(ref.shape) == 4)
    key = registry.store.key_of(weight.digest)
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[-1] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    with pytest.raises(IntegrityError, match=f"{weight.digest[:12]}.*tampered"):
        registry.pull("net@1", tmp_path / "again.onnx")
    assert not (tmp_path / "again.onnx").exists()
    registry.meta.close()
