"""Registry service: registration behind the equivalence gate, reading, diff, lineage, aliases, verify, gc, bad input.

Runs on SQLite (tmp_path) and on PostgreSQL (a fresh database per test, tests/pg.py). Also holds the
helpers the CLI and crash-safety tests share (a small torch CNN, stats-only fine-tuning).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from schemas.errors import (
    CheckFailedError,
    InputFileError,
    IntegrityError,
    NormbridgeError,
    NotFoundError,
    RegistryError,
    SpecError,
)
from tests.pg import registry_on


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 6, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(6, eps=1e-3, momentum=0.01)
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


def trained_cnn(seed: int = 0) -> SmallCNN:
    """A CNN after three real SGD steps (weights and statistics moved), in eval mode."""
    torch.manual_seed(seed)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for _ in range(3):
        x = torch.randn(8, 3, 8, 8)
        loss = torch.nn.functional.cross_entropy(model(x), (x.mean(dim=(1, 2, 3)) > 0).long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@torch.no_grad()
def finetune_statistics(model: SmallCNN, seed: int = 1) -> SmallCNN:
    """Move only the BatchNorm running statistics: weights frozen, train-mode forwards on shifted data."""
    torch.manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    model.train()
    for _ in range(3):
        model(torch.randn(8, 3, 8, 8) * 2 + 0.5)
    return model.eval()


def save_pt2(model: SmallCNN, path: Path) -> Path:
    torch.export.save(torch.export.export(model, (torch.randn(2, 3, 8, 8),)), str(path))
    return path


def blob_path(registry, digest: str) -> Path:
    """Where the local blob store keeps a digest (sharded 'ab/cdef...')."""
    root = Path(registry.store.root)
    candidates = [root / digest[:2] / digest[2:], root / digest[:2] / digest]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    found = list(root.rglob(f"*{digest[2:]}*"))
    assert found, f"blob {digest} not found under {root}"
    return found[0]


def snapshot(registry) -> dict:
    """Everything a failed registration must leave unchanged: versions, audit actions and blobs."""
    return {
        "versions": [
            (r.model, r.number, r.digest) for name, _, _ in registry.models() for r in registry.meta.versions(name)
        ],
        "audit": [(a.seq, a.action) for a in registry.audit()],
        "blobs": sorted(registry.store.digests()),
    }


def expire_leases(registry) -> int:
    """Age every blob lease past LEASE_SECONDS, as a day passing does: what a crashed registration leased is then
    swept."""
    from datetime import timedelta

    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from registry.blob_leases import LEASE_SECONDS
    from registry.db.models import BlobLeaseRow

    with Session(registry.meta.engine) as session, session.begin():
        rows = session.scalars(select(BlobLeaseRow)).all()
        for row in rows:
            row.taken_at -= timedelta(seconds=LEASE_SECONDS + 60)
    return len(rows)


def assert_unchanged_but_failure(registry, before: dict) -> None:
    after = snapshot(registry)
    assert after["versions"] == before["versions"]
    assert after["blobs"] == before["blobs"]
    assert after["audit"][: len(before["audit"])] == before["audit"]
    assert [action for _, action in after["audit"][len(before["audit"]) :]] == ["register_failed"]
    assert registry.verify_audit() == []


@pytest.fixture(params=["sqlite", "postgresql"])
def registry(request, tmp_path):
    with registry_on(request.param, tmp_path, "tester") as reg:
        yield reg


@pytest.fixture
def sqlite_registry(tmp_path):
    from registry.service import Registry

    return Registry(db=f"sqlite:///{tmp_path / 'registry.db'}", blobs=str(tmp_path / "blobs"), user="tester")


# -- registration, reading, diff, lineage ----------------------------------------------------------


def test_a_stats_only_fine_tune_registers_as_a_child_that_shares_every_weight_blob(registry):
    model = trained_cnn()
    first = registry.register("cnn", model, note="3 SGD steps")
    assert first.created and first.version.number == 1 and first.version.parent is None
    assert first.version.operation == "registered" and first.version.user == "tester"
    assert len(first.checks) == 2 and all(c.passed for c in first.checks)
    assert [e["passed"] for e in first.version.manifest["equivalence"]] == [True, True]
    blobs_v1 = set(registry.store.digests())

    again = registry.register("cnn", model)
    assert (again.created, again.version.number) == (False, 1)

    finetune_statistics(model)
    second = registry.register("cnn", model)
    assert second.created and second.version.number == 2
    assert (second.version.parent, second.version.operation) == ("cnn@1", "fine-tuned")
    new_blobs = set(registry.store.digests()) - blobs_v1
    tensors_v1, tensors_v2 = first.version.manifest["tensors"], second.version.manifest["tensors"]
    stats = {n for n, t in tensors_v2.items() if t["role"] in ("running_mean", "running_var", "num_batches_tracked")}
    assert len(stats) == 6 and new_blobs == {
        tensors_v2[n]["digest"] for n in stats
    }  # only the statistics were stored again
    assert all(tensors_v1[n]["digest"] == t["digest"] for n, t in tensors_v2.items() if n not in stats)

    diff = registry.diff("cnn@1", "cnn@2")
    assert "weights identical" in diff.render_text() and "running statistics changed in 2 layers" in diff.render_text()
    tensors = registry.tensors("cnn@2")
    np.testing.assert_array_equal(tensors["bn1.running_mean"], model.bn1.running_mean.numpy())
    np.testing.assert_array_equal(tensors["conv1.weight"], model.conv1.weight.numpy())

    view = registry.lineage("cnn@1").render_text()
    assert "cnn@1" in view and "cnn@2" in view and "fine-tuned" in view
    assert [r.number for r in registry.versions("cnn")] == [1, 2]
    assert registry.models() == [("cnn", 2, 2)]
    assert [a.action for a in registry.audit(model="cnn")] == ["register", "register_existing", "register"]
    assert registry.verify().passed


def test_a_registration_says_where_its_time_went_step_by_step(sqlite_registry, tmp_path):
    """`seconds` (what `register --json` prints and bench/registry.py reads the gate's marginal cost from): each step's
    wall time, measured around the step, so together no more than the whole call; an identical registration too."""
    import time

    path = save_pt2(trained_cnn(), tmp_path / "cnn.pt2")
    for created in (True, False):
        start = time.perf_counter()
        done = sqlite_registry.register("cnn", path)
        whole = time.perf_counter() - start
        assert done.created is created
        assert list(done.seconds) == ["reading", "gate", "staging", "commit"]
        assert all(spent > 0 for spent in done.seconds.values()) and sum(done.seconds.values()) <= whole


def test_parent_and_operation_can_be_given_and_aliases_move_with_history(sqlite_registry):
    reg = sqlite_registry
    model = trained_cnn()
    reg.register("cnn", model)
    finetune_statistics(model)
    reg.register("cnn", model, operation="recalibrated", note="new camera")
    finetune_statistics(model, seed=2)
    third = reg.register("cnn", model, parent="cnn@1", operation="recalibrated")
    assert (third.version.parent, third.version.operation) == ("cnn@1", "recalibrated")
    reg.set_alias("cnn", "production", "cnn@2")
    assert reg.show("cnn@production").number == 2
    reg.set_alias("cnn", "production", "3")
    assert reg.show("cnn@production").number == 3
    assert reg.show("cnn@latest").number == reg.show("cnn").number == 3  # as the HTTP API's paths read it
    with pytest.raises(RegistryError, match="not valid"):
        reg.set_alias("cnn", "latest", "cnn@1")
    assert [a.number for a in reg.meta.alias_history("cnn", "production")] == [2, 3]
    view = reg.lineage("cnn@1").render_text()
    assert "cnn@2" in view and "cnn@3" in view
    with pytest.raises(NotFoundError):
        reg.register("cnn", model, parent="cnn@9")
    with pytest.raises(RegistryError, match="operation"):
        reg.register("cnn", model, operation="teleported")
    with pytest.raises(RegistryError, match="another model"):
        reg.register("other", trained_cnn(seed=5))
        reg.set_alias("other", "production", "cnn@1")
    with pytest.raises(NotFoundError):
        reg.show("cnn@7")


def test_zero_configuration_uses_sqlite_and_blobs_under_normbridge_home(tmp_path, monkeypatch):
    from registry.service import Registry

    monkeypatch.setenv("NORMBRIDGE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NORMBRIDGE_DB", raising=False)
    monkeypatch.delenv("NORMBRIDGE_BLOBS", raising=False)
    reg = Registry()
    reg.register("cnn", trained_cnn())
    assert (tmp_path / "home" / "registry.db").is_file()
    assert any((tmp_path / "home" / "blobs").rglob("*"))
    assert Registry().show("cnn").number == 1


# -- the equivalence gate and bad input ------------------------------------------------------------


def test_a_failing_equivalence_check_stores_nothing_and_names_the_layer(sqlite_registry):
    from converters.gate import InProcessGate
    from registry.service import Registry

    class FailingOnBn2(InProcessGate):
        """The real checks, in this process, with one layer's verdict overturned."""

        def check_all(self, specs, progress=None):
            overturned = {"passed": False, "errors": ["onnx: running_var differs by 1e-2"]}
            return [
                result.model_copy(update=overturned) if result.layer == "bn2" else result
                for result in super().check_all(specs, progress)
            ]

    sqlite_registry.register("cnn", trained_cnn())
    reg = Registry(db=sqlite_registry.db_url, blobs=sqlite_registry.blob_uri, user="tester", gate=FailingOnBn2())
    before = snapshot(reg)
    model = finetune_statistics(trained_cnn())
    with pytest.raises(
        CheckFailedError, match="layer 'bn2' failed the round-trip equivalence check .*running_var differs"
    ):
        reg.register("cnn", model)
    assert_unchanged_but_failure(reg, before)


def _bad_inputs(tmp_path: Path) -> dict:
    """name -> (what to register, the error type it must raise)."""

    from registry.artifact import extract_artifact
    from registry.manifest_io import save_artifact_folder

    cases = {}
    folder = save_artifact_folder(extract_artifact(trained_cnn(seed=3)), tmp_path / "artifact")
    corrupt = shutil.copytree(folder, tmp_path / "corrupt")
    blob = min((corrupt / "blobs").iterdir())
    blob.chmod(stat.S_IWUSR | stat.S_IRUSR)
    blob.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage" + os.urandom(16))
    cases["corrupted safetensors"] = (corrupt, NormbridgeError)
    schema = shutil.copytree(folder, tmp_path / "schema")
    document = json.loads((schema / "manifest.json").read_text())
    document["mode"] = "sideways"
    (schema / "manifest.json").write_text(json.dumps(document))
    cases["manifest failing its schema"] = (schema, SpecError)

    import converters

    proto = converters.convert(torch.nn.BatchNorm2d(4).eval(), to="onnx")
    proto.graph.node[0].input[0] = "no_such_tensor"
    proto.graph.node[0].op_type = "NoSuchOp"
    (tmp_path / "bad.onnx").write_bytes(proto.SerializeToString())
    cases["onnx failing the checker"] = (tmp_path / "bad.onnx", InputFileError)

    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()
    inputs = keras.Input((4, 4, 3))
    x = keras.layers.Lambda(lambda t: t * 2.0)(inputs)
    keras.Model(inputs, keras.layers.BatchNormalization()(x)).save(tmp_path / "lambda.keras")
    cases["keras with a Lambda layer"] = (tmp_path / "lambda.keras", InputFileError)

    torch.save(trained_cnn().state_dict(), tmp_path / "model.pt")
    cases["pickle"] = (tmp_path / "model.pt", InputFileError)

    nan_model = trained_cnn()
    with torch.no_grad():
        nan_model.bn2.running_var[1] = float("nan")
    cases["NaN statistics"] = (nan_model, SpecError)
    return cases


def test_every_bad_input_is_refused_with_a_clear_error_and_leaves_the_registry_unchanged(sqlite_registry, tmp_path):
    reg = sqlite_registry
    reg.register("cnn", trained_cnn())
    for label, (model, error_type) in _bad_inputs(tmp_path).items():
        before = snapshot(reg)
        with pytest.raises(error_type) as info:
            reg.register("cnn", model)
        message = str(info.value)
        assert len(message) > 20 and "\n" not in message.strip(), (label, message)
        if label == "NaN statistics":
            assert "bn2" in message
        assert_unchanged_but_failure(reg, before)
        assert reg.audit()[-1].detail.get("error") == info.value.code, label
    assert [r.number for r in reg.versions("cnn")] == [1]


# -- integrity: verify, never serve tampered bytes, gc --------------------------------------------


def test_a_tampered_blob_is_reported_by_verify_naming_tensor_and_version_and_never_served(sqlite_registry):
    reg = sqlite_registry
    model = trained_cnn()
    reg.register("cnn", model)
    finetune_statistics(model)
    reg.register("cnn", model)
    digest = reg.show("cnn@2").manifest["tensors"]["bn1.running_var"]["digest"]
    path = blob_path(reg, digest)
    path.chmod(stat.S_IWUSR | stat.S_IRUSR)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))

    result = reg.verify()
    assert not result.passed
    assert [(p.model, p.number, p.kind, p.tensor) for p in result.problems] == [("cnn", 2, "blob", "bn1.running_var")]
    assert reg.verify("cnn@1").passed  # version 1 does not use the tampered bytes
    with pytest.raises(IntegrityError, match=r"cnn@2: tensor 'bn1.running_var'"):
        reg.tensors("cnn@2")
    with pytest.raises(IntegrityError, match="bn1.running_var"):
        reg.diff("cnn@1", "cnn@2")
    with pytest.raises(IntegrityError):
        reg.export("cnn@2", "onnx", reg_folder(reg))


def reg_folder(reg) -> Path:
    return Path(reg.store.root).parent / f"export-{uuid.uuid4().hex[:6]}"


def test_gc_deletes_only_unreferenced_blobs_older_than_the_grace_period(sqlite_registry):
    reg = sqlite_registry
    reg.register("cnn", trained_cnn())
    referenced = set(reg.store.digests())
    orphan = reg.store.put(b"left behind by a crashed registration")
    kept = reg.gc(grace_seconds=3600)
    assert kept.deleted == [] and kept.kept_young == [orphan]
    swept = reg.gc(grace_seconds=0)
    assert swept.deleted == [orphan] and swept.bytes_freed == len(b"left behind by a crashed registration")
    assert set(reg.store.digests()) == referenced
    assert reg.verify(rerun_checks=False).passed
    with pytest.raises(RegistryError, match="negative"):
        reg.gc(grace_seconds=-1)


def test_export_writes_each_normalization_layer_through_the_converters(sqlite_registry, tmp_path):
    import onnx

    import converters

    reg = sqlite_registry
    model = trained_cnn()
    reg.register("cnn", model)
    result = reg.export("cnn@1", "onnx", tmp_path / "out")
    assert [layer.path for layer in result.layers] == ["bn1", "bn2"]
    spec = converters.to_spec(onnx.load(result.layers[1].file))
    assert spec.eps == 1e-3
    np.testing.assert_array_equal(spec.tensors["running_var"], model.bn2.running_var.numpy())
    with pytest.raises(RegistryError, match="not supported"):
        reg.export("cnn@1", "tflite", tmp_path / "out2")
