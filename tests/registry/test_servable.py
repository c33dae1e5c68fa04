"""The servable verdict of a version and the guard on aliases such as production, through registry.service.Registry.

Real models, real registrations (SQLite and PostgreSQL for the core): a .pt2 exported in train mode, BatchNorms that
never saw data, a float16 BatchNorm whose eps rounds to 0, and a trained eval model. What each should be is read from
the model itself (its modules' mode and statistics, NumPy's float16 rounding), never from the code under test. The same
surfaces over HTTP, the CLI and the web pages: tests/registry/http/test_servable_surfaces.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sqlalchemy import update

from registry.db.models import VersionRow
from schemas.errors import HTTP_STATUSES, NotServableError, exit_code_for
from tests.pg import registry_on
from tests.registry.test_registry_service import SmallCNN, save_pt2, trained_cnn


@pytest.fixture(params=["sqlite", "postgresql"])
def registry(request, tmp_path):
    with registry_on(request.param, tmp_path, "alice") as opened:
        yield opened


@pytest.fixture
def local(tmp_path):
    with registry_on("sqlite", tmp_path, "alice") as opened:
        yield opened


def batchnorm_paths(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)]


def train_mode_pt2(folder) -> tuple[torch.nn.Module, object]:
    model = trained_cnn().train()
    assert all(m.training for m in model.modules())
    return model, save_pt2(model, folder / "train-mode.pt2")


def untrained_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    for name in batchnorm_paths(model):
        bn = model.get_submodule(name)
        assert (
            int(bn.num_batches_tracked) == 0
            and bool((bn.running_mean == 0).all())
            and bool((bn.running_var == 1).all())
        )
    return model


def blocking(record) -> set[tuple[str, str | None]]:
    return {(h["code"], h["layer"]) for h in record.hazards if h["blocking"]}


def test_a_pt2_exported_in_train_mode_is_not_servable_and_the_guard_refuses_it_unless_forced(registry, tmp_path):
    model, path = train_mode_pt2(tmp_path)
    record = registry.register("cnn", path).version
    assert record.servable is False
    assert blocking(record) == {("train_mode", name) for name in batchnorm_paths(model)}
    assert all("exported in train mode" in h["message"] for h in record.hazards if h["code"] == "train_mode")
    assert registry.show("cnn@1") == record  # stored with the version, read back as registered
    assert registry.audit(model="cnn")[-1].detail["not_servable"] == ["train_mode"]

    with pytest.raises(
        NotServableError, match=r"cnn@production' is guarded and cnn@1 is not servable: train_mode at bn1"
    ) as refused:
        registry.set_alias("cnn", "production", "cnn@1")
    assert exit_code_for(refused.value) == 22 and HTTP_STATUSES[NotServableError] == 409
    assert registry.aliases("cnn") == []
    last = registry.audit(model="cnn")[-1]
    assert (last.action, last.number, last.detail["alias"], last.detail["error"]) == (
        "alias_refused",
        1,
        "production",
        "not_servable",
    )

    assert registry.set_alias("cnn", "staging", "cnn@1").number == 1  # only guarded aliases are refused
    moved = registry.set_alias("cnn", "production", "cnn@1", force=True)
    assert (moved.alias, moved.number) == ("production", 1)
    entry = registry.audit(model="cnn")[-1]
    assert (entry.action, entry.user, entry.detail) == (
        "alias",
        "alice",
        {"alias": "production", "from": None, "to": 1, "forced": True, "not_servable": ["train_mode"]},
    )
    assert registry.verify_audit() == []


def test_batchnorms_that_never_saw_data_are_not_servable_and_a_trained_eval_model_is(registry):
    model = untrained_cnn()
    record = registry.register("fresh", model).version
    assert record.servable is False and blocking(record) == {("never_trained", name) for name in batchnorm_paths(model)}

    clean = registry.register("clean", trained_cnn()).version
    assert clean.servable is True and blocking(clean) == set()
    assert registry.set_alias("clean", "production", "clean@1").number == 1
    assert (
        "forced" not in registry.audit(model="clean")[-1].detail
        and "not_servable" not in registry.audit(model="clean")[-2].detail
    )


def test_an_eps_that_rounds_to_zero_in_float16_is_not_servable(local):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3, eps=1e-8))
    with torch.no_grad():
        model.train()
        for _ in range(3):
            model(torch.randn(16, 4))
    assert np.float16(1e-8) == 0  # the eps the layer's float16 statistics would add
    record = local.register("half", model.eval().half()).version
    assert record.servable is False and blocking(record) == {("eps_underflow", "1")}
    trained_fp32 = local.register("full", model.float()).version
    assert trained_fp32.servable is True


def test_the_guarded_aliases_are_configurable(tmp_path, monkeypatch):
    from registry.service import Registry

    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    Registry(db=db, blobs=blobs).register("fresh", untrained_cnn())

    guarded = Registry(db=db, blobs=blobs, guarded_aliases=["canary", "stable"])
    assert guarded.guarded_aliases == {"canary", "stable"}
    with pytest.raises(NotServableError, match="fresh@canary' is guarded"):
        guarded.set_alias("fresh", "canary", "1")
    assert guarded.set_alias("fresh", "production", "1").number == 1  # not guarded by this registry

    monkeypatch.setenv("NORMBRIDGE_GUARDED_ALIASES", "staging, production")
    from_env = Registry(db=db, blobs=blobs)
    assert from_env.guarded_aliases == {"staging", "production"}
    with pytest.raises(NotServableError):
        from_env.set_alias("fresh", "staging", "1")
    monkeypatch.setenv("NORMBRIDGE_GUARDED_ALIASES", "")
    assert Registry(db=db, blobs=blobs).set_alias("fresh", "staging", "1").number == 1  # set but empty: nothing guarded
    monkeypatch.delenv("NORMBRIDGE_GUARDED_ALIASES")
    assert Registry(db=db, blobs=blobs).guarded_aliases == {"production"}


def test_a_version_registered_before_verdicts_were_stored_is_assessed_when_read(local, tmp_path):
    _, path = train_mode_pt2(tmp_path)
    local.register("cnn", path)
    local.register("clean", trained_cnn())
    with local.meta.engine.begin() as connection:  # as a registry upgraded by migration 0004 holds its older versions
        connection.execute(update(VersionRow).values(servable=None, hazards=None))
    assert local.meta.resolve("cnn@1").servable is None
    assert local.show("cnn@1").servable is False and blocking(local.show("cnn@1")) == {
        ("train_mode", "bn1"),
        ("train_mode", "bn2"),
    }
    assert [r.servable for r in local.versions("clean")] == [True]
    with pytest.raises(NotServableError):
        local.set_alias("cnn", "production", "1")


def test_unconverged_statistics_are_recorded_as_a_warning_that_does_not_block(local):
    from converters import recalibrate

    model = trained_cnn()  # three SGD steps: each BatchNorm counted 3 batches at momentum 0.1
    expected = {
        name
        for name in batchnorm_paths(model)
        if (1 - model.get_submodule(name).momentum) ** int(model.get_submodule(name).num_batches_tracked) >= 0.05
    }
    assert expected == set(batchnorm_paths(model))
    record = local.register("cnn", model).version
    found = {h["layer"]: h for h in record.hazards if h["code"] == "unconverged_statistics"}
    assert set(found) == expected and all(h["severity"] == "warning" and not h["blocking"] for h in found.values())
    assert record.servable is True and local.show("cnn@1").hazards == record.hazards
    assert "not_servable" not in local.audit(model="cnn")[-1].detail
    assert local.set_alias("cnn", "production", "cnn@1").number == 1  # recorded and shown, never a reason to refuse
    # statistics re-estimated as a cumulative average over 4 batches keep none of the initial values,
    # whatever the counter says
    recalibrated, _ = recalibrate(
        model, [np.random.default_rng(i).standard_normal((8, 3, 8, 8)).astype(np.float32) for i in range(4)]
    )
    assert all(int(recalibrated.get_submodule(name).num_batches_tracked) == 4 for name in expected)
    child = local.register("cnn", recalibrated, operation="recalibrated").version
    assert child.servable is True and not [h for h in child.hazards if h["code"] == "unconverged_statistics"]
