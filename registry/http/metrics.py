"""GET /metrics: the service's own counters and each version's drift state, in the Prometheus text format.

Every app gets its own `prometheus_client.CollectorRegistry` (`app.state.metrics`), never the
process-global one, so tests that build several apps do not collide. Labels stay bounded: a
request is labelled with its route *template* ('/api/v1/models/{name}/versions'), 'unmatched' when
no route matched, never the raw path; drift series carry model, version and layer only.

Service metrics are kept per process (with `serve --workers N` each scrape answers from one worker).
Drift metrics are read from the database at scrape time, so every worker and replica answers the
same. The serving series (each layer's figures in the newest window and the version's alert state) come from serving
windows only: a drift history store's read (`history_windows(current)`), or what a store with no such read pushes
through `DriftGauges.observe`. Offline checks (`normbridge drift --record`) never move them: the newest check's verdict
of every version is its own series, normbridge_drift_offline_verdict (`recorded_checks`), as the API shows it beside
the state (see docs/metrics.md). Access follows the API's tokens: a read token may scrape, and a token scoped to
some models sees only those models' drift series.

Every version that ever posted a window or recorded a report has drift series, so their number grows with the registry;
a scrape exports at most MAX_DRIFT_SERIES of them (whole versions, those in alert and with the newest figures first) and
says in normbridge_omitted_drift_series how many it left out.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from registry.drift_records import latest_drift_reports
from schemas.errors import CheckFailedError

from .auth import Principal, require

#: A version's alert state as a number, so an alert rule can say `>= 2` (a serving fault, 3, is past every drift state).
ALERT_STATES = {"ok": 0, "warning": 1, "alert": 2, "serving_fault": 3}
#: A layer's state as a number (drift's per-layer status).
LAYER_STATES = {"ok": 0, "unconverged_statistics": 1, "drift": 2}
#: An offline check's verdict as a number, in the same order.
OFFLINE_VERDICTS = {"no drift": 0, "unconverged statistics": 1, "drift": 2}
#: The most drift series one scrape exports (three per layer, one per version's alert state); docs/metrics.md.
MAX_DRIFT_SERIES = 10_000
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_REGISTER_ROUTE = ("POST", "/api/v1/models/{name}/versions")


def registration_outcome(status: int) -> str:
    """What a POST of a model ended as, from its status: created, existing (identical content), refused
    (gate), rejected, error."""
    if status == 201:
        return "created"
    if status == 200:
        return "existing"
    if status == 409:
        return "refused"
    return "rejected" if status < 500 else "error"


@dataclass(frozen=True)
class DriftObservation:
    """One layer's latest drift figures for a version: max standardized shift, worst variance factor, state."""

    shift: float
    variance_ratio: float
    state: str
    at: float


#: Where serving drift figures come from at scrape time: source(registry) -> (layers, alert states), keyed like the
#: labels, or (layers, alert states, serving fault kinds per version) from a source that knows them (history_windows).
DriftSource = Callable[[Any], tuple]
#: Where offline verdicts come from at scrape time: source(registry) -> {(model, version): (verdict, when)}.
OfflineSource = Callable[[Any], dict[tuple[str, int], tuple[str, float]]]


def recorded_checks(registry) -> dict[tuple[str, int], tuple[str, float]]:
    """The verdict of the newest offline check recorded per version (`drift --record`), and when it was recorded."""
    return {
        (record.model, record.number): (record.report.verdict, record.created_at.timestamp())
        for record in latest_drift_reports(registry.meta)
    }


def history_windows(current: Callable[[Any], Iterable[Any]]) -> DriftSource:
    """A source over a drift history store's `current(registry)`: per version its state and newest window's layers.

    Each item is read by attribute: model, number, state (ok|warning|alert) and last (None, or a window with received_at
    and layers, each with name, max_shift, max_abs_log_ratio, over and status: the layer state is the status, so a layer
    whose stored statistics never converged reads unconverged_statistics (1), not drift; `over` stands in for a store
    that keeps no status)."""

    def source(registry) -> tuple[dict, dict, dict]:
        layers, alerts, faults = {}, {}, {}
        for version in current(registry):
            alerts[(version.model, version.number)] = version.state
            window = version.last
            if window is None:
                continue
            if version.state == "serving_fault":
                kinds = {fault.kind for fault in getattr(window, "faults", ())}
                faults[(version.model, version.number)] = sorted(kinds)
            stamp = window.received_at.timestamp()
            for layer in window.layers:
                state = getattr(layer, "status", None) or ("drift" if layer.over else "ok")
                layers[(version.model, version.number, layer.name)] = DriftObservation(
                    layer.max_shift, math.exp(layer.max_abs_log_ratio), state, stamp
                )
        return layers, alerts, faults

    return source


class DriftGauges:
    """The drift series: each serving source read at scrape time (later ones override earlier ones), then what `observe`
    was told; beside them, each version's newest offline verdict from `offline`, which never enters the serving series.

    `observe(model, version, layer, shift, ratio, state)` is the push alternative for a store that has no `current`
    read: it keeps the newest value per label set (thread-safe); `set_alert_state(model, version, state)` sets a
    version's state.
    """

    def __init__(
        self,
        registry=None,
        sources: Sequence[DriftSource] = (),
        max_series: int = MAX_DRIFT_SERIES,
        offline: OfflineSource | None = recorded_checks,
    ):
        self._registry = registry
        self._sources = tuple(sources) if registry is not None else ()
        self._offline = offline if registry is not None else None
        self._max_series = max_series
        self._lock = threading.Lock()
        self._layers: dict[tuple[str, int, str], DriftObservation] = {}
        self._alerts: dict[tuple[str, int], str] = {}

    def observe(self, model: str, version: int, layer: str, shift: float, ratio: float, state: str) -> None:
        """Record a layer's latest window: `shift` the max standardized mean shift,
        `ratio` the worst variance factor (>= 1)."""
        if state not in LAYER_STATES:
            raise ValueError(
                f"layer state '{state}' for {model}@{version} layer '{layer}' is not one of {sorted(LAYER_STATES)}"
            )
        with self._lock:
            self._layers[(model, int(version), layer)] = DriftObservation(
                float(shift), float(ratio), state, time.time()
            )

    def set_alert_state(self, model: str, version: int, state: str) -> None:
        """The version's state by the history's sustained-shift rule: ok, warning or alert."""
        if state not in ALERT_STATES:
            raise ValueError(f"alert state '{state}' for {model}@{version} is not one of {sorted(ALERT_STATES)}")
        with self._lock:
            self._alerts[(model, int(version))] = state

    def snapshot(self) -> tuple[dict, dict, dict]:
        """(layers, alert states, offline verdicts) keyed like the labels: the serving sources in order,
        observations on top."""
        layers, alerts, offline, _ = self.snapshot_with_faults()
        return layers, alerts, offline

    def snapshot_with_faults(self) -> tuple[dict, dict, dict, dict]:
        """`snapshot` and the serving fault kinds of each version in state serving_fault: {(model, version): [kind]}."""
        layers: dict[tuple[str, int, str], DriftObservation] = {}
        alerts: dict[tuple[str, int], str] = {}
        faults: dict[tuple[str, int], list[str]] = {}
        for source in self._sources:
            found = source(self._registry)
            layers.update(found[0])
            alerts.update(found[1])
            if len(found) > 2:
                faults.update(found[2])
        with self._lock:
            layers.update(self._layers)
            alerts.update(self._alerts)
        faults = {key: kinds for key, kinds in faults.items() if alerts.get(key) == "serving_fault"}
        return layers, alerts, (self._offline(self._registry) if self._offline is not None else {}), faults

    def families(self, principal: Principal) -> list[GaugeMetricFamily]:
        """The drift metric families the caller may see (a scoped token: its models only),
        at most max_series of them."""
        layers, alerts, offline, faults = self.snapshot_with_faults()
        layers = {key: seen for key, seen in layers.items() if principal.may_see(key[0])}
        alerts = {key: state for key, state in alerts.items() if principal.may_see(key[0])}
        offline = {key: found for key, found in offline.items() if principal.may_see(key[0])}
        layers, alerts, offline, left_out = capped(layers, alerts, self._max_series, offline, faults)
        faults = {key: kinds for key, kinds in faults.items() if key in alerts}
        shift = GaugeMetricFamily(
            "normbridge_drift_shift",
            "Max over channels of |mean - running_mean| / sqrt(running_var + eps) in the latest serving window.",
            labels=["model", "version", "layer"],
        )
        ratio = GaugeMetricFamily(
            "normbridge_drift_variance_ratio",
            "Worst channel's variance factor against running_var "
            "(exp of max |log ratio|; 2 = halved or doubled) in the latest serving window.",
            labels=["model", "version", "layer"],
        )
        layer_state = GaugeMetricFamily(
            "normbridge_drift_layer_state",
            "Layer state in the latest serving window: 0 ok, "
            "1 unconverged_statistics, 2 drift (over a threshold beyond its sampling error).",
            labels=["model", "version", "layer"],
        )
        alert = GaugeMetricFamily(
            "normbridge_drift_alert_state",
            "Version alert state from serving windows only: 0 ok, "
            "1 warning, 2 alert, 3 serving_fault (the model is served wrongly: see "
            "normbridge_serving_fault).",
            labels=["model", "version"],
        )
        fault = GaugeMetricFamily(
            "normbridge_serving_fault",
            "1 for each serving fault kind the newest serving window of "
            "a version carries (train_mode, statistics_changed, batch_statistics_in_graph, "
            "statistics_mismatch); docs/monitoring.md.",
            labels=["model", "version", "kind"],
        )
        checked = GaugeMetricFamily(
            "normbridge_drift_offline_verdict",
            "Verdict of the newest offline check (drift --record), which "
            "never moves the alert state: 0 no drift, 1 unconverged statistics, 2 drift.",
            labels=["model", "version"],
        )
        omitted = GaugeMetricFamily(
            "normbridge_omitted_drift_series",
            f"Drift series left out of this scrape past its cap of "
            f"{self._max_series} (whole versions, the calmest and stalest first).",
        )
        for (model, version, layer), seen in sorted(layers.items()):
            labels = [model, str(version), layer]
            shift.add_metric(labels, seen.shift)
            ratio.add_metric(labels, seen.variance_ratio)
            layer_state.add_metric(labels, LAYER_STATES[seen.state])
        for (model, version), state in sorted(alerts.items()):
            alert.add_metric([model, str(version)], ALERT_STATES[state])
        for (model, version), kinds in sorted(faults.items()):
            for kind in kinds:
                fault.add_metric([model, str(version), kind], 1)
        for (model, version), (verdict, _) in sorted(offline.items()):
            checked.add_metric([model, str(version)], OFFLINE_VERDICTS[verdict])
        omitted.add_metric([], left_out)
        return [shift, ratio, layer_state, alert, fault, checked, omitted]


def capped(
    layers: dict, alerts: dict, limit: int, offline: dict | None = None, faults: dict | None = None
) -> tuple[dict, dict, dict, int]:
    """(layers, alerts, offline verdicts) of the versions that fit in `limit` series, and how many series were left out.

    A version is kept or left out whole (its layers' three series, its alert state and its offline verdict), so no
    version is shown half. The ones kept first are those an operator must see: in alert, then with a drifting layer,
    then with an offline check that found drift, then with the newest figures."""
    offline, faults = offline or {}, faults or {}
    keys: dict[tuple[str, int], list] = {}
    for key in layers:
        keys.setdefault(key[:2], []).append(key)

    def priority(version: tuple[str, int]):
        own = [layers[key] for key in keys.get(version, ())]
        verdict, checked_at = offline.get(version, ("no drift", 0.0))
        return (
            -ALERT_STATES.get(alerts.get(version, "ok"), 0),
            -max((LAYER_STATES[seen.state] for seen in own), default=0),
            -OFFLINE_VERDICTS[verdict],
            -max([seen.at for seen in own] + [checked_at]),
            version,
        )

    kept, used, left_out = set(), 0, 0
    for version in sorted(set(keys) | set(alerts) | set(offline), key=priority):
        cost = (
            3 * len(keys.get(version, ())) + (version in alerts) + (version in offline) + len(faults.get(version, ()))
        )
        if used + cost <= limit:
            kept.add(version)
            used += cost
        else:
            left_out += cost
    return (
        {key: seen for key, seen in layers.items() if key[:2] in kept},
        {key: state for key, state in alerts.items() if key in kept},
        {key: found for key, found in offline.items() if key in kept},
        left_out,
    )


class GateTimer:
    """A registration's progress callback that times the equivalence gate (the 'checking ...' steps) into a histogram.

    Used as a context manager around the registration: a gate that raises ends there, as 'failed' or 'error'."""

    def __init__(self, histogram: Histogram):
        self._histogram = histogram
        self._started: float | None = None
        self._finished = False

    def __call__(self, step: str, done: int, total: int) -> None:
        if step.startswith("checking "):
            if self._started is None:
                self._started = time.perf_counter()
        elif self._started is not None:
            self._finish("passed")

    def _finish(self, outcome: str) -> None:
        if not self._finished and self._started is not None:
            self._finished = True
            self._histogram.labels(outcome=outcome).observe(time.perf_counter() - self._started)

    def __enter__(self) -> "GateTimer":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self._finish("passed" if error is None else "failed" if isinstance(error, CheckFailedError) else "error")


class ServiceMetrics:
    """One app's metrics: its own CollectorRegistry, the request and registration counters, the gate histogram,
    drift gauges."""

    def __init__(
        self, registry=None, drift_sources: Sequence[DriftSource] = (), max_drift_series: int = MAX_DRIFT_SERIES
    ):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "normbridge_http_requests",
            "HTTP requests by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "normbridge_http_request_duration_seconds",
            "Time from request to the end of the response, by route template.",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registrations = Counter(
            "normbridge_registrations",
            "Model registrations by outcome: created, existing, refused, rejected, error.",
            ["outcome"],
            registry=self.registry,
        )
        self.gate = Histogram(
            "normbridge_gate_duration_seconds",
            "Time the equivalence gate took per registration, by outcome.",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.drift = DriftGauges(registry, drift_sources, max_drift_series)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in _METHODS else "OTHER"
        self.requests.labels(method=method, route=route, status=str(status)).inc()
        self.latency.labels(method=method, route=route).observe(seconds)
        if (method, route) == _REGISTER_ROUTE:
            self.registrations.labels(outcome=registration_outcome(status)).inc()

    def gate_timer(self) -> GateTimer:
        return GateTimer(self.gate)

    def exposition(self, principal: Principal) -> bytes:
        """The text the caller may scrape."""
        return generate_latest(_Scrape(self, principal))


class _Scrape:
    """What generate_latest collects for one caller: the service families and the drift families in scope."""

    def __init__(self, metrics: ServiceMetrics, principal: Principal):
        self._metrics, self._principal = metrics, principal

    def collect(self) -> Iterable:
        yield from self._metrics.registry.collect()
        yield from self._metrics.drift.families(self._principal)


class MetricsMiddleware:
    """Pure ASGI middleware (outermost): counts every HTTP request by its route template and status, and times it."""

    def __init__(self, app, metrics: ServiceMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"  # the router fills scope["route"] in place
            self.metrics.observe_request(scope.get("method", "GET"), route, status[0], time.perf_counter() - started)


router = APIRouter()
Reader = Annotated[Principal, Depends(require("read"))]


@router.get("/metrics", include_in_schema=False)  # a text format for Prometheus, outside the JSON API (docs/metrics.md)
def metrics(request: Request, principal: Reader) -> Response:
    """Service and drift metrics in the Prometheus text format (a read token; a scoped token sees its models' drift)."""
    return Response(request.app.state.metrics.exposition(principal), media_type=CONTENT_TYPE_LATEST)


def install(app, registry=None, drift_sources: Sequence[DriftSource] = ()) -> ServiceMetrics:
    """Give `app` its own metrics (app.state.metrics), the counting middleware and GET /metrics;
    call after every other middleware.

    `drift_sources` (serving windows) are read at each scrape, in order (a history store gives `history_windows(its
    current)`); the offline verdicts are read from the registry's recorded checks."""
    app.state.metrics = ServiceMetrics(registry, drift_sources)
    app.include_router(router)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app.state.metrics


__all__ = [
    "ALERT_STATES",
    "DriftGauges",
    "DriftObservation",
    "DriftSource",
    "GateTimer",
    "LAYER_STATES",
    "MAX_DRIFT_SERIES",
    "MetricsMiddleware",
    "OFFLINE_VERDICTS",
    "OfflineSource",
    "ServiceMetrics",
    "capped",
    "history_windows",
    "install",
    "recorded_checks",
    "registration_outcome",
]
