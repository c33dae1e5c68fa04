"""A registration checks every normalizer the model holds and stores only tensors whose headers tell the truth.

Attacks of issue 11 (items 5 and 6), each through every door a model comes in: the library, the real
`normbridge` command, and an upload to a real `normbridge serve` process.
- A torch-exported ONNX model whose BatchNormalization holds a NaN running_var used to register with
  0 normalizers and 0 checks; a BatchNorm folded away by tf2onnx, likewise.
- A bundle tensor claiming shape [1000000] over 16 bytes, dtype 'object' or shape [-4] used to be
  accepted; a registry row edited in SQLite to lie used to pass `verify`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from registry.artifact import extract_artifact
from registry.manifest_io import save_artifact_folder
from registry.service import Registry
from schemas.errors import CheckFailedError, InputFileError, SpecError
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from tests.http_server import writer_server
from tests.registry.test_bundle_stream import members_of, tar_of
from tests.registry.test_registry_service import trained_cnn

BN_NODE = "node__native_batch_norm_legit_no_training__0"  # the name torch.onnx gives the BatchNormalization node
LIES = {  # label -> (safetensors dtype code, manifest dtype, shape), each over 16 data bytes
    "shape [1000000] over 16 bytes": ("F32", "float32", [1_000_000]),
    "dtype object": ("object", "object", [2]),
    "shape [-4]": ("F32", "float32", [-4]),
}
LIE_MESSAGE = r"tensor 'extra\.weight' (claims 16 bytes for float32\[1000000\], which holds 4000000|has dtype 'object'|has shape \[-4\])"


def conv_bn_onnx(nan: bool) -> onnx.ModelProto:
    """Conv + BatchNorm2d + ReLU exported by torch.onnx (not optimized, so the BatchNormalization node stays)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).train()
    with torch.no_grad():
        model(torch.randn(8, 3, 8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = torch.onnx.export(
            model.eval(), (torch.randn(2, 3, 8, 8),), dynamo=True, optimize=False, verbose=False
        ).model_proto
    assert [n.name for n in proto.graph.node if n.op_type == "BatchNormalization"] == [BN_NODE]
    if nan:
        for initializer in proto.graph.initializer:
            if initializer.name == "1.running_var":
                values = numpy_helper.to_array(initializer).copy()
                values[1] = np.nan
                initializer.CopyFrom(numpy_helper.from_array(values, initializer.name))
    return proto


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("onnx")
    files = {"clean": folder / "clean.onnx", "nan": folder / "nan.onnx"}
    for label, path in files.items():
        onnx.save(conv_bn_onnx(nan=label == "nan"), path)
    return files


@pytest.fixture(scope="module")
def artifact_folder(tmp_path_factory) -> Path:
    return save_artifact_folder(extract_artifact(trained_cnn(seed=5)), tmp_path_factory.mktemp("artifact") / "cnn")


@pytest.fixture
def local(tmp_path) -> Registry:
    registry = Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"), user="tester")
    yield registry
    registry.meta.close()


def stored(registry: Registry) -> dict:
    return {"versions": [(name, n) for name, n, _ in registry.models()], "blobs": sorted(registry.store.digests())}


def lying_folder(base: Path, target: Path, lie: str) -> Path:
    """The artifact plus a non-normalizer tensor 'extra.weight' whose manifest entry and safetensors header agree on a
    lie."""
    code, dtype, shape = LIES[lie]
    folder = Path(shutil.copytree(base, target))
    header = json.dumps(
        {"tensor": {"dtype": code, "shape": shape, "data_offsets": [0, 16]}}, separators=(",", ":")
    ).encode()
    blob = struct.pack("<Q", len(header)) + header + bytes(16)
    digest = hashlib.sha256(blob).hexdigest()
    (folder / "blobs" / f"{digest}.safetensors").write_bytes(blob)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tensors"]["extra.weight"] = {
        "digest": digest,
        "dtype": dtype,
        "shape": shape,
        "nbytes": 16,
        "role": "weight",
        "layer": "extra",
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def cli_env(tmp_path: Path) -> dict[str, str]:
    return {
        "NORMBRIDGE_DB": f"sqlite:///{tmp_path / 'cli.db'}",
        "NORMBRIDGE_BLOBS": str(tmp_path / "cli-blobs"),
        "NORMBRIDGE_USER": "cli",
        "COLUMNS": "250",
    }


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`normbridge ARGS` as a real process on the registry in `tmp_path`."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **cli_env(tmp_path)}
    return subprocess.run(
        normbridge_command() + list(args), env=env, capture_output=True, text=True, timeout=300, check=False
    )


def invoke(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The same command in this process (the console script's app through CliRunner)."""
    return invoke_cli(*args, cwd=tmp_path, env=cli_env(tmp_path), columns=250)


# -- item 5: every normalizer is checked, or the registration is refused -------------------------------


def test_an_onnx_batchnorm_with_a_nan_running_var_is_refused_naming_the_layer(local, onnx_files):
    clean = local.register("clean", onnx_files["clean"])  # the same model without the NaN: one layer, one check
    assert len(clean.checks) == 1 and len(local.manifest("clean@1").normalizers) == 1
    before = stored(local)
    with pytest.raises(SpecError) as caught:
        local.register("cnn", onnx_files["nan"])
    assert (caught.value.layer, caught.value.setting) == (BN_NODE, "running_var")
    assert "NaN" in str(caught.value) and str(caught.value).startswith(f"layer '{BN_NODE}', setting 'running_var': ")
    assert stored(local) == before
    assert [(e.action, e.detail["error"], e.detail["layer"]) for e in local.audit(model="cnn")] == [
        ("register_failed", "invalid_spec", BN_NODE)
    ]


@pytest.mark.slow
def test_the_cli_refuses_the_nan_onnx_and_registers_nothing(tmp_path, onnx_files):
    refused = run_cli(tmp_path, "register", "cnn", str(onnx_files["nan"]))
    assert refused.returncode == 3, (refused.stdout, refused.stderr)
    assert BN_NODE in refused.stderr and "running_var" in refused.stderr and "NaN" in refused.stderr
    models = invoke(tmp_path, "models", "--json")
    assert models.returncode == 0 and json.loads(models.stdout) == []


def test_a_batchnorm_folded_away_by_tf2onnx_is_refused_not_skipped(local, tmp_path):
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()
    model = keras.Sequential(
        [keras.Input((5, 3)), keras.layers.BatchNormalization(name="bn"), keras.layers.Dense(2, name="dense")]
    )
    model(np.random.default_rng(1).normal(size=(4, 5, 3)).astype("float32"), training=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.export(str(tmp_path / "k.onnx"), format="onnx", verbose=False)
    with pytest.raises(SpecError, match=r"folded into Mul/Add constants.*cannot be checked") as caught:
        local.register("keras-onnx", tmp_path / "k.onnx")
    assert caught.value.layer and stored(local) == {"versions": [], "blobs": []}


def test_a_bundle_listing_normalizer_state_without_its_normalizers_is_refused(local, artifact_folder, tmp_path):
    """The bundle form of item 5: drop the manifest's normalizers and the gate would have nothing to check."""
    manifest = json.loads((artifact_folder / "manifest.json").read_text())
    manifest["normalizers"] = []
    members = [
        (n, json.dumps(manifest).encode() if n == "manifest.json" else d) for n, d in members_of(artifact_folder)
    ]
    with pytest.raises(
        SpecError, match=r"tensor 'bn1\.\w+' holds \w+ state but no normalizer of the manifest uses it"
    ) as caught:
        local.register_stream("cnn", io.BytesIO(tar_of(members)), 1 << 40)
    assert caught.value.layer == "bn1"
    folder = Path(shutil.copytree(artifact_folder, tmp_path / "no-normalizers"))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SpecError, match="no normalizer of the manifest uses it"):
        local.register("cnn", folder)
    assert stored(local) == {"versions": [], "blobs": []}


def test_the_gate_refuses_fewer_checks_than_normalization_layers(artifact_folder):
    from registry.manifest_io import load_artifact_folder
    from registry.coverage import check_registrable

    artifact = load_artifact_folder(artifact_folder)
    assert len(artifact.specs) == 2
    check_registrable(artifact.manifest, artifact.specs, 2)
    with pytest.raises(CheckFailedError, match="the manifest lists 2 normalizers and 1 would be checked"):
        check_registrable(artifact.manifest, artifact.specs[:1])
    with pytest.raises(
        CheckFailedError, match="the model holds 3 normalization layers, the manifest lists 2 and 2 would be checked"
    ):
        check_registrable(artifact.manifest, artifact.specs, 3)
    assert extract_artifact(trained_cnn()).sites == 2  # what the torch reader found


# -- item 6: tensor headers that lie ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("lie", list(LIES))
def test_a_bundle_tensor_whose_header_lies_is_refused_streamed_and_from_a_folder(local, artifact_folder, tmp_path, lie):
    folder = lying_folder(artifact_folder, tmp_path / "lying", lie)
    with pytest.raises(InputFileError, match=LIE_MESSAGE):
        local.register_stream("cnn", io.BytesIO(tar_of(members_of(folder))), 1 << 40)
    with pytest.raises(InputFileError, match=LIE_MESSAGE):
        local.register("cnn", folder)
    assert stored(local) == {"versions": [], "blobs": []}
    refused = invoke(tmp_path, "register", "cnn", str(folder))
    assert refused.returncode == 6 and "extra.weight" in refused.stderr, (refused.stdout, refused.stderr)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    with writer_server(root, "writer") as (client, db, blobs):
        yield client, Registry(db=db, blobs=blobs, user="test"), root


@pytest.mark.slow
def test_uploads_of_the_nan_onnx_and_of_lying_bundles_are_refused_and_store_nothing(
    server, onnx_files, artifact_folder
):
    client, registry, root = server
    refused = client.post(
        "/api/v1/models/cnn/versions", params={"format": "onnx"}, content=onnx_files["nan"].read_bytes()
    )
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["layer"], error["setting"]) == (
        "invalid_spec",
        BN_NODE,
        "running_var",
    ) and "NaN" in error["message"]
    for i, lie in enumerate(LIES):
        body = tar_of(members_of(lying_folder(artifact_folder, root / f"lying-{i}", lie)))
        refused = client.post("/api/v1/models/cnn/versions", params={"format": "bundle"}, content=body)
        assert refused.status_code == 400, (lie, refused.text)
        assert refused.json()["error"]["code"] == "bad_input_file"
        assert re.search(LIE_MESSAGE, refused.json()["error"]["message"]), (lie, refused.json())
    assert stored(registry) == {"versions": [], "blobs": []}
    accepted = client.post(
        "/api/v1/models/cnn/versions", params={"format": "bundle"}, content=tar_of(members_of(artifact_folder))
    )
    assert accepted.status_code == 201, accepted.text  # the same bundle without the lie


@pytest.mark.parametrize(
    "lie", ["shape [1000000] with its bytes", "dtype object", "shape [-4]", "a shape the blob does not hold"]
)
def test_verify_fails_when_a_stored_manifest_row_is_edited_to_lie(local, tmp_path, lie):
    local.register("cnn", trained_cnn())
    assert local.verify().passed
    database = sqlite3.connect(tmp_path / "registry.db")
    (text,) = database.execute("SELECT manifest FROM versions").fetchone()
    manifest = json.loads(text)
    entry = manifest["tensors"]["conv2.weight"]  # float32 [6, 4, 3, 3], 864 bytes: not a normalizer's tensor
    if lie == "shape [1000000] with its bytes":
        entry["shape"] = [1_000_000]
    elif lie == "dtype object":
        entry["dtype"] = "object"
    elif lie == "shape [-4]":
        entry["shape"] = [-4, 6, 3, 3]
    else:
        entry["shape"] = [4, 6, 3, 3]  # consistent with its dtype and 864 bytes, but not what the blob holds
    database.execute("UPDATE versions SET manifest = ?", (json.dumps(manifest),))
    database.commit()
    database.close()
    result = local.verify()
    assert not result.passed
    found = [p for p in result.problems if p.kind == "tensor"]
    assert [(p.model, p.number, p.tensor) for p in found] == [("cnn", 1, "conv2.weight")], result.problems
    expected = {
        "shape [1000000] with its bytes": r"claims 864 bytes for float32\[1000000\]",
        "dtype object": "has dtype 'object'",
        "shape [-4]": r"has shape \[-4, 6, 3, 3\]",
        "a shape the blob does not hold": r"holds float32\[6, 4, 3, 3\] but the manifest says float32\[4, 6, 3, 3\]",
    }
    assert re.search(expected[lie], found[0].message), found[0].message
    with pytest.raises(InputFileError, match="conv2.weight"):
        local.tensors("cnn@1")
    if lie != "a shape the blob does not hold":  # a row that cannot describe real bytes is not even read as a manifest
        with pytest.raises(InputFileError, match="tensor 'conv2.weight'"):
            local.export("cnn@1", "onnx", tmp_path / "never")
        assert not (tmp_path / "never").exists()


def test_a_syncbatchnorm_is_now_read_as_a_batchnorm_and_checked_not_passed_over(local):
    """SyncBatchNorm computes a BatchNorm at eval (issue 13): it is read and checked like the others, never skipped."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.SyncBatchNorm(4)).eval()
    result = local.register("cnn", model)
    assert [c.passed for c in result.checks] == [True, True] and result.unrecognised == []


@pytest.mark.parametrize("layer", ["LazyBatchNorm2d"])
def test_a_torch_normalization_layer_the_reader_cannot_classify_refuses_the_model(local, layer):
    """The torch-module form of item 5: the walker used to pass over these, so they registered unchecked."""
    from schemas.errors import UnsupportedObjectError

    norm = torch.nn.SyncBatchNorm(4) if layer == "SyncBatchNorm" else torch.nn.LazyBatchNorm2d()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), norm).eval()
    with pytest.raises(
        UnsupportedObjectError, match="registered only when each of its normalization layers is checked"
    ) as caught:
        local.register("cnn", model)
    assert caught.value.layer == "2" and stored(local) == {"versions": [], "blobs": []}
