"""The drift history store on SQLite and PostgreSQL: shifts against the version's own statistics (checked with NumPy),
the k-of-m rule moved one window at a time, a bounded number of statements per window whatever its size, retention,
and each layer's status: statistics that never converged are not drift and never alert.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from alembic import command
from sqlalchemy import event, func, select, update
from sqlalchemy.orm import Session

from converters.models.monitoring.drift import drift_check
from registry import drift_history
from registry.db.drift_rows import DriftLayerRow, DriftWindowRow
from registry.db.engine import alembic_config
from schemas.errors import InputFileError
from schemas.monitoring import DriftRule
from tests.pg import registry_on
from testkit.monitoring_models import MonitoredCNN, calm, converged, served_window, shifted, torch_cnn, unconverged_cnn


@pytest.fixture(params=["sqlite", "postgresql"])
def registry(request, tmp_path):
    with registry_on(request.param, tmp_path, "collector") as reg:
        yield reg


def _bns(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]


def window(model, shift_sd: float = 0.0, ratio: float = 1.0, count: int = 500, digest: str | None = None) -> dict:
    """A window whose every channel sits `shift_sd` running standard deviations off and has `ratio` times the running
    variance."""
    now = datetime.now(UTC)
    layers = [
        {
            "name": n,
            "count": count,
            "mean": (m.running_mean.double() + shift_sd * m.running_var.double().sqrt()).tolist(),
            "var": (m.running_var.double() * ratio).tolist(),
        }
        for n, m in _bns(model)
    ]
    return {
        "started_at": (now - timedelta(seconds=60)).isoformat(),
        "ended_at": now.isoformat(),
        "requests": 100,
        "sampled": 10,
        "layers": layers,
        "statistics_digest": digest,
    }


def test_each_layer_is_compared_with_the_versions_statistics(registry):
    model = torch_cnn()
    registry.register("cnn", model)
    body = window(model)
    rng = np.random.default_rng(0)
    for layer in body["layers"]:
        layer["mean"] = (np.asarray(layer["mean"]) + rng.standard_normal(len(layer["mean"]))).tolist()
    record = drift_history.record_window(registry, "cnn@1", body)
    for layer, (name, bn) in zip(record.layers, _bns(model)):
        sent = next(item for item in body["layers"] if item["name"] == name)
        shift = np.abs(np.asarray(sent["mean"]) - bn.running_mean.double().numpy()) / np.sqrt(
            bn.running_var.double().numpy() + bn.eps
        )
        assert layer.name == name and layer.max_shift == pytest.approx(shift.max(), rel=1e-9)
        assert layer.mean_shift == pytest.approx(shift.mean(), rel=1e-9) and layer.worst_shift_channel == int(
            shift.argmax()
        )
        assert layer.variance_ratio == pytest.approx(1.0, abs=1e-6)
    stored = drift_history.window_arrays(registry, record.id)
    assert stored[body["layers"][0]["name"]]["mean"] == body["layers"][0]["mean"]


def test_the_rule_moves_one_window_at_a_time_and_audits_each_change(registry):
    model = torch_cnn()
    registry.register("cnn", model)
    rule = DriftRule(k=2, m=3)
    states = [
        drift_history.record_window(registry, "cnn", window(model, shift_sd=s, ratio=r), rule).state
        for s, r in ((0, 1), (2, 1), (0, 1), (0, 3), (0, 1), (0, 1), (0, 1))
    ]
    assert states == [
        "ok",
        "warning",
        "warning",
        "alert",
        "warning",
        "warning",
        "ok",
    ]  # a ratio of 3 is over log(2) too
    found = drift_history.history(registry, "cnn@1", limit=2)
    assert (found.state, found.recent, found.windows_total, len(found.windows)) == ("ok", "000", 7, 2)
    assert found.windows[0].id > found.windows[1].id  # newest first
    assert drift_history.state(registry, "cnn@1") == "ok"
    changes = [
        (e.detail["from"], e.detail["to"]) for e in registry.audit(model="cnn") if e.action == "drift_state_changed"
    ]
    assert changes == [("ok", "warning"), ("warning", "alert"), ("alert", "warning"), ("warning", "ok")]
    assert registry.verify_audit() == []
    [current] = drift_history.current(registry)
    assert (current.model, current.number, current.state, current.windows, current.last.id) == (
        "cnn",
        1,
        "ok",
        7,
        found.windows[0].id,
    )


def _statements(registry, work) -> int:
    seen = []
    listener = lambda *args: seen.append(args[2])  # noqa: E731  (before_cursor_execute: conn, cursor, statement, ...)
    event.listen(registry.meta.engine, "before_cursor_execute", listener)
    try:
        work()
    finally:
        event.remove(registry.meta.engine, "before_cursor_execute", listener)
    return len(
        [s for s in seen if not s.lstrip().upper().startswith(("SELECT", "PRAGMA", "BEGIN", "SAVEPOINT", "RELEASE"))]
    )


class WideCNN(MonitoredCNN):
    """Ten BatchNorm layers instead of two (the statements per window must not grow with them)."""

    def __init__(self):
        super().__init__()
        self.extra = torch.nn.ModuleList(torch.nn.BatchNorm2d(6) for _ in range(8))

    def forward(self, x):
        x = super().forward(x)
        return x


def test_a_window_costs_the_same_few_writes_whatever_its_layer_count(registry):
    small, wide = torch_cnn(), converged(WideCNN())
    registry.register("small", small)
    registry.register("wide", wide)
    for name, model in (("small", small), ("wide", wide)):
        drift_history.record_window(registry, name, window(model))  # first window: creates the state row
    writes = {
        name: _statements(
            registry, lambda name=name, model=model: drift_history.record_window(registry, name, window(model))
        )
        for name, model in (("small", small), ("wide", wide))
    }
    assert writes["small"] == writes["wide"] <= 5, writes  # window, layers (one executemany), arrays, state


def test_a_serving_fault_is_the_state_at_once_and_a_clean_window_gives_the_rule_back(registry):
    """Issue 35 item 1: a foreign digest (was a 409) and a fault the collector sent make serving_fault in one window."""
    model = torch_cnn()
    registry.register("cnn", model)
    foreign = drift_history.record_window(registry, "cnn@1", window(model, digest="0" * 64))
    assert foreign.state == "serving_fault" and [f.kind for f in foreign.faults] == ["statistics_mismatch"]
    assert "other running statistics" in foreign.faults[0].detail
    clean = drift_history.record_window(registry, "cnn@1", window(model, count=501))
    assert clean.state == "ok" and clean.faults == [] and drift_history.history(registry, "cnn@1").faults == []
    sent = {**window(model, count=502), "faults": [{"kind": "train_mode", "layer": "bn1", "detail": "training=True"}]}
    faulty = drift_history.record_window(registry, "cnn@1", sent)
    found = drift_history.history(registry, "cnn@1")
    assert faulty.state == found.state == "serving_fault"
    assert [(f.kind, f.layer) for f in found.faults] == [("train_mode", "bn1")]
    assert found.windows[0].faults == faulty.faults and found.windows[2].faults == foreign.faults  # stored, read back
    changes = [
        (e.detail["from"], e.detail["to"], e.detail.get("faults"))
        for e in registry.audit(model="cnn")
        if e.action == "drift_state_changed"
    ]
    assert changes == [
        ("ok", "serving_fault", ["statistics_mismatch"]),
        ("serving_fault", "ok", None),
        ("ok", "serving_fault", ["train_mode"]),
    ]


def test_refusals_store_nothing(registry):
    model = torch_cnn()
    registry.register("cnn", model)
    body = window(model)
    body["layers"] = [{**layer, "name": f"not-{layer['name']}"} for layer in body["layers"]]
    with pytest.raises(InputFileError, match="none of the window's layers"):
        drift_history.record_window(registry, "cnn@1", body)
    body = window(model)
    body["layers"][0] = {**body["layers"][0], "mean": [0.0], "var": [1.0]}
    with pytest.raises(InputFileError, match="channels"):
        drift_history.record_window(registry, "cnn@1", body)
    # a NaN or negative variance was a 500 (NOT NULL constraint on variance_ratio);
    # a NaN mean or an Infinity moved the state
    for change, says in (
        ({"mean": [float("nan")] + window(model)["layers"][0]["mean"][1:]}, "finite"),
        ({"var": [float("inf")] + window(model)["layers"][0]["var"][1:]}, "finite"),
        ({"var": [-5.0] + window(model)["layers"][0]["var"][1:]}, "negative"),
    ):
        body = window(model)
        body["layers"][0] = {**body["layers"][0], **change}
        with pytest.raises(ValidationError, match=says):
            drift_history.record_window(registry, "cnn@1", body)
    body = window(model)
    body["started_at"], body["ended_at"] = body["ended_at"], body["started_at"]
    with pytest.raises(ValidationError, match="before it starts"):
        drift_history.record_window(registry, "cnn@1", body)
    body = window(model)
    body["layers"].append(body["layers"][0])
    with pytest.raises(ValidationError, match="more than once"):
        drift_history.record_window(registry, "cnn@1", body)
    assert drift_history.history(registry, "cnn@1").windows_total == 0


def test_retention_drops_old_arrays_and_keeps_the_summaries(registry, monkeypatch):
    model = torch_cnn()
    registry.register("cnn", model)
    old = drift_history.record_window(registry, "cnn@1", window(model))
    with Session(registry.meta.engine) as session, session.begin():
        session.execute(
            update(DriftWindowRow)
            .where(DriftWindowRow.id == old.id)
            .values(received_at=datetime.now(UTC).replace(tzinfo=None) - timedelta(days=40))
        )
    monkeypatch.setattr(drift_history, "_last_sweep", [0.0])
    fresh = drift_history.record_window(registry, "cnn@1", window(model))
    assert (
        drift_history.window_arrays(registry, old.id) is None
        and drift_history.window_arrays(registry, fresh.id) is not None
    )
    assert [w.id for w in drift_history.history(registry, "cnn@1").windows] == [fresh.id, old.id]


def test_rule_settings_come_from_the_environment_and_bad_ones_name_the_setting(monkeypatch):
    monkeypatch.setenv("NORMBRIDGE_DRIFT_K", "2")
    monkeypatch.setenv("NORMBRIDGE_DRIFT_SHIFT", "0.25")
    assert (drift_history.rule().k, drift_history.rule().m, drift_history.rule().shift) == (2, 5, 0.25)
    monkeypatch.setenv("NORMBRIDGE_DRIFT_K", "9")
    with pytest.raises(InputFileError, match="NORMBRIDGE_DRIFT"):
        drift_history.rule()
    monkeypatch.setenv("NORMBRIDGE_DRIFT_K", "three")
    with pytest.raises(InputFileError, match="NORMBRIDGE_DRIFT_K"):
        drift_history.rule()


def test_unconverged_statistics_are_reported_as_such_and_never_alert(registry):
    model = unconverged_cnn()
    registry.register("fresh", model)
    rng = np.random.default_rng(3)
    traffic = [calm(rng, 32) for _ in range(5)]  # the very population the statistics were tracking
    records = [drift_history.record_window(registry, "fresh@1", served_window(model, x)) for x in traffic]
    offline = drift_check(model, traffic[0])  # the offline command on the first window's inputs: the same rule
    assert offline.verdict == "unconverged statistics"
    for record in records:
        assert any(layer.over for layer in record.layers)  # the thresholds alone alarm: it looks shifted
        assert [layer.status for layer in record.layers] == ["unconverged_statistics"] * 2, record.layers
        assert not record.over and record.state == "ok"
    assert [layer.status for layer in records[0].layers] == [layer.status for layer in offline.layers]
    assert records[0].layers[0].initial_weight == pytest.approx(
        0.9**3
    )  # num_batches_tracked 3 at momentum 0.1, from the manifest
    found = drift_history.history(registry, "fresh@1")
    assert (found.state, found.recent) == ("ok", "00000")
    assert [[layer.status for layer in w.layers] for w in found.windows] == [
        ["unconverged_statistics"] * 2
    ] * 5  # read back as stored
    assert not [e for e in registry.audit(model="fresh") if e.action == "drift_state_changed"]


def test_converged_statistics_on_shifted_traffic_still_alert(registry):
    model = torch_cnn()
    registry.register("cnn", model)
    rng = np.random.default_rng(4)
    calm_record = drift_history.record_window(registry, "cnn@1", served_window(model, calm(rng, 32)))
    assert [layer.status for layer in calm_record.layers] == ["ok", "ok"] and calm_record.state == "ok"
    states = []
    for _ in range(3):
        record = drift_history.record_window(registry, "cnn@1", served_window(model, shifted(rng, 32)))
        assert "drift" in [layer.status for layer in record.layers] and record.over, record.layers
        assert all(layer.initial_weight < 0.05 for layer in record.layers)  # 64 tracked batches at 0.1: converged
        states.append(record.state)
    assert states == ["warning", "warning", "alert"]
    assert drift_history.history(registry, "cnn@1").windows[0].layers[0].status == "drift"


def test_layers_stored_before_migration_0007_read_drift_where_they_were_over(registry):
    model = unconverged_cnn()
    registry.register("fresh", model)
    record = drift_history.record_window(registry, "fresh@1", served_window(model, calm(np.random.default_rng(3), 32)))
    over = [layer.over for layer in record.layers]
    assert any(over) and {layer.status for layer in record.layers} == {"unconverged_statistics"}
    with registry.meta.engine.connect() as connection:  # back to the schema before the status, and up again
        command.downgrade(alembic_config(connection), "0006")
        connection.commit()
        command.upgrade(alembic_config(connection), "head")
        connection.commit()
    [stored] = drift_history.history(registry, "fresh@1").windows
    assert [layer.status for layer in stored.layers] == [
        "drift" if flag else "ok" for flag in over
    ]  # as the rule counted them then
    assert all(layer.initial_weight is None for layer in stored.layers)


def test_a_window_stored_twice_counts_once_and_migration_0009_keeps_the_history(registry):
    model = torch_cnn()
    registry.register("cnn", model)
    body = window(model, shift_sd=2.0)
    first, created = drift_history.store_window(registry, "cnn@1", body)
    again, created_again = drift_history.store_window(
        registry, "cnn@1", {**body, "ended_at": body["ended_at"].replace("+00:00", "Z")}
    )
    assert created and not created_again and again == first
    assert drift_history.history(registry, "cnn@1").recent == "1"
    with registry.meta.engine.connect() as connection:  # back to the schema before the digest, and up again
        command.downgrade(alembic_config(connection), "0008")
        connection.commit()
        assert connection.execute(select(func.count()).select_from(DriftLayerRow)).scalar_one() == 2
        command.upgrade(alembic_config(connection), "head")
        connection.commit()
    found = drift_history.history(registry, "cnn@1")
    assert found.windows_total == 1 and len(found.windows[0].layers) == 2
    # a window stored before 0009 carries no digest: the same window once more is stored once more,
    # and from then on counts once
    assert (
        drift_history.store_window(registry, "cnn@1", body)[1]
        and not drift_history.store_window(registry, "cnn@1", body)[1]
    )
    big = drift_history.record_window(
        registry,
        "cnn@1",
        {**window(model), "requests": 2**63 - 1, "layers": [{**layer, "count": 2**63 - 1} for layer in body["layers"]]},
    )
    stored = drift_history.history(registry, "cnn@1").windows
    assert len(stored) == 3 and stored[0].id == big.id and stored[0].requests == stored[0].layers[0].count == 2**63 - 1


def test_each_layer_is_judged_beyond_its_windows_sampling_error_and_migration_0010_keeps_older_layers(
    registry, monkeypatch
):
    """Issue 34 item 15: the collector's batches give each channel's standard errors; the stored bound is NumPy's."""
    import converters

    stats = pytest.importorskip("scipy.stats")
    model = torch_cnn()
    registry.register("cnn", model)
    rng = np.random.default_rng(5)
    watch = converters.monitor(model, sample_rate=1.0, window_requests=4)
    with torch.no_grad():
        for _ in range(4):
            model(torch.from_numpy(calm(rng)))
    watch.close()
    body = watch.closed_windows[0]
    record = drift_history.record_window(registry, "cnn@1", body)
    for layer, sent, (name, bn) in zip(record.layers, body["layers"], _bns(model)):
        assert layer.name == sent["name"] == name and layer.batches == sent["batches"] == 4
        scale = np.sqrt(bn.running_var.double().numpy() + bn.eps)
        shift = np.abs(np.asarray(sent["mean"]) - bn.running_mean.double().numpy()) / scale
        multiplier = stats.t.isf(0.01 / (2 * len(shift)), 3)
        assert layer.error_multiplier == pytest.approx(multiplier, rel=1e-8)
        assert layer.shift_bound == pytest.approx(
            (shift - multiplier * np.asarray(sent["se_mean"]) / scale).max(), rel=1e-9
        )
        assert layer.over == (layer.shift_bound > 0.5 or layer.log_ratio_bound > np.log(2))
    assert (
        drift_history.window_arrays(registry, record.id)[body["layers"][0]["name"]]["se_mean"]
        == body["layers"][0]["se_mean"]
    )

    monkeypatch.setenv("NORMBRIDGE_DRIFT_FALSE_ALARM", "0.2")
    assert drift_history.rule().false_alarm == 0.2
    monkeypatch.setenv("NORMBRIDGE_DRIFT_FALSE_ALARM", "2")
    with pytest.raises(InputFileError, match="NORMBRIDGE_DRIFT"):
        drift_history.rule()
    monkeypatch.delenv("NORMBRIDGE_DRIFT_FALSE_ALARM")

    with registry.meta.engine.connect() as connection:  # back to the schema before the sampling error, and up again
        command.downgrade(alembic_config(connection), "0009")
        connection.commit()
        command.upgrade(alembic_config(connection), "head")
        connection.commit()
    [stored] = drift_history.history(registry, "cnn@1").windows
    assert [(layer.over, layer.status) for layer in stored.layers] == [
        (layer.over, layer.status) for layer in record.layers
    ]
    assert all(
        layer.batches is None and layer.shift_bound is None and layer.error_multiplier is None
        for layer in stored.layers
    )
