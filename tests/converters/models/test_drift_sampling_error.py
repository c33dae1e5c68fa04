"""The drift rule against a window's sampling error (issue 34 item 15), held against NumPy and simulated traffic.

A window's standard errors are NumPy's cluster-robust ones over its batches; Student's t quantile is scipy's. Then
many windows are simulated through the collector's own window (merge per batch, payload, schema) and judged by the
rule the registry applies, on layer inputs shaped like a CNN's: each input row has its own offset (so the values of one
feature map are correlated) and each position a fixed pattern (so they are not exchangeable either). Traffic drawn
from the reference distribution, or sitting just under or exactly at the shift threshold, must alarm in at most
`false_alarm` (1%) of windows, where the bare threshold test alarms in most; a real shift twice the threshold must
still alarm in nearly every window of 20 batches.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from converters.models.monitoring.drift import channel_shift
from converters.models.monitoring.sampling_error import error_multiplier, judge_layer, t_quantile
from converters.models.monitoring.window import ChannelMoments, Window
from schemas.monitoring import DriftRule, DriftWindow

RULE = DriftRule()


def test_a_windows_standard_errors_are_numpys_cluster_robust_errors_over_its_batches():
    rng = np.random.default_rng(0)
    batches = [
        rng.standard_normal((int(rng.integers(2, 60)), 6)) * 3.0 + 1e3 + rng.standard_normal(6) for _ in range(9)
    ]
    moments = ChannelMoments()
    for x in batches:
        moments.merge(len(x), x.mean(0), x.var(0))
    everything = np.concatenate(batches)
    n, mean, var, b = len(everything), everything.mean(0), everything.var(0), len(batches)
    se_mean = np.sqrt(b / (b - 1) * sum((len(x) / n) ** 2 * (x.mean(0) - mean) ** 2 for x in batches))
    second = [np.square(x - mean).mean(0) for x in batches]  # each batch's second moment about the pooled mean
    se_var = np.sqrt(b / (b - 1) * sum((len(x) / n) ** 2 * (q - var) ** 2 for x, q in zip(batches, second)))
    found_mean, found_var = moments.standard_errors()
    np.testing.assert_allclose(found_mean, se_mean, rtol=1e-9)
    np.testing.assert_allclose(found_var, se_var, rtol=1e-9)
    assert moments.batches == b

    one = ChannelMoments()
    one.merge(10, np.zeros(6), np.ones(6))
    assert one.standard_errors() is None  # one batch measures no spread
    window = Window(1, moments=[one])
    assert "se_mean" not in window.payload(["bn"], "r", 0, None)["layers"][0]


def test_the_t_quantile_is_scipys():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 9, 19, 99, 999, 50_000):
        for p in (0.05, 1e-3, 3.9e-5, 2.4e-6):
            assert t_quantile(p, float(df)) == pytest.approx(stats.t.isf(p, df), rel=1e-8), (df, p)
    assert error_multiplier(64, 20, 0.01) == pytest.approx(stats.t.isf(0.01 / 128, 19), rel=1e-8)
    assert error_multiplier(64, None, 0.01) == pytest.approx(stats.norm.isf(0.01 / 128), rel=1e-8)
    assert error_multiplier(64, 1, 0.01) is None


class Traffic:
    """Layer inputs of C channels at P positions: x = mean + row offset (sd tau) + fixed pattern per position + noise.

    The reference (running) statistics are this population's exact mean and variance per channel."""

    def __init__(
        self, rng, channels: int = 64, positions: int = 4, tau: float = 1.0, pattern: float = 0.7, noise: float = 0.8
    ):
        self.rng, self.tau, self.noise = rng, tau, noise
        self.pattern = rng.normal(0.0, pattern, (channels, positions))
        self.pattern -= self.pattern.mean(1, keepdims=True)
        self.running_mean = rng.normal(0.0, 2.0, channels)
        self.running_var = tau**2 + self.pattern.var(1) + noise**2
        self.channels, self.positions = channels, positions

    def batch(self, rows: int, shift_sd: float = 0.0) -> np.ndarray:
        offset = self.rng.normal(0.0, self.tau, (rows, self.channels, 1))
        noise = self.rng.normal(0.0, self.noise, (rows, self.channels, self.positions))
        return (
            (self.running_mean + shift_sd * np.sqrt(self.running_var))[None, :, None]
            + offset
            + self.pattern[None]
            + noise
        )

    def window(self, batches: int, rows: int, shift_sd: float = 0.0) -> dict:
        """The payload the collector would ship for `batches` requests of `rows` inputs each, checked by the schema."""
        window = Window(1)
        for _ in range(batches):
            x = self.batch(rows, shift_sd)
            window.moments[0].merge(rows * self.positions, x.mean((0, 2)), x.var((0, 2)))
        window.requests = window.sampled = batches
        return DriftWindow.model_validate(window.payload(["bn"], "sim", 0, None)).layers[0]

    def alarms(self, layer, with_batches: bool = True) -> tuple[bool, bool]:
        """(the bare threshold test, the rule beyond the sampling error) on one window's layer."""
        shift, log_ratio = channel_shift(layer.mean, layer.var, self.running_mean, self.running_var, 0.0)
        bare = bool(shift.max() > RULE.shift or np.abs(log_ratio).max() > RULE.log_ratio)
        batches, se_mean, se_var = (layer.batches, layer.se_mean, layer.se_var) if with_batches else (None, None, None)
        judged = judge_layer(
            shift,
            log_ratio,
            layer.var,
            self.running_var,
            0.0,
            layer.count,
            batches,
            se_mean,
            se_var,
            RULE.shift,
            RULE.log_ratio,
            RULE.false_alarm,
        )
        return bare, judged.over


WINDOWS = 600


@pytest.mark.parametrize(
    "case, shift_sd, batches, rows",
    [
        ("the reference distribution, 4 requests of 2 inputs", 0.0, 4, 2),
        ("the reference distribution, 20 requests of 8 inputs", 0.0, 20, 8),
        ("a true shift of 0.45, under the 0.5 threshold, 20 requests of 8", 0.45, 20, 8),
        ("a true shift exactly at the threshold, 50 requests of 8", 0.5, 50, 8),
    ],
)
def test_traffic_within_the_thresholds_alarms_in_at_most_the_stated_share_of_windows(case, shift_sd, batches, rows):
    traffic = Traffic(np.random.default_rng(1))
    found = np.array([traffic.alarms(traffic.window(batches, rows, shift_sd)) for _ in range(WINDOWS)])
    bare, beyond_error = found.mean(0)
    # If the true rate were RULE.false_alarm (1%), more than 2.5% of 600 windows alarming has probability under 0.3%.
    assert beyond_error <= 0.025, (case, beyond_error)
    if shift_sd > 0.0 or rows == 2:
        assert bare >= 0.4, (case, bare)  # what the bare threshold test does with the same windows


def test_standard_errors_from_the_count_alone_would_not_hold_the_stated_share():
    """Why the collector sends its batches: values of one input are correlated,
    so `count` overstates the information."""
    traffic = Traffic(np.random.default_rng(2), tau=1.5, pattern=0.2, noise=0.4)
    found = np.array(
        [
            (traffic.alarms(layer)[1], traffic.alarms(layer, with_batches=False)[1])
            for layer in (traffic.window(20, 8, 0.45) for _ in range(WINDOWS))
        ]
    )
    by_batches, by_count = found.mean(0)
    assert by_batches <= 0.025 and by_count >= 0.2, (by_batches, by_count)


@pytest.mark.parametrize(
    "shift_sd, batches, rows, at_least", [(1.0, 20, 8, 0.99), (1.0, 10, 8, 0.95), (0.75, 50, 8, 0.95)]
)
def test_a_real_shift_still_alarms_at_the_stated_count(shift_sd, batches, rows, at_least):
    traffic = Traffic(np.random.default_rng(3))
    found = np.array([traffic.alarms(traffic.window(batches, rows, shift_sd))[1] for _ in range(200)])
    assert found.mean() >= at_least, found.mean()


def test_a_layer_seen_in_one_batch_cannot_alarm_and_a_client_without_batches_is_judged_on_its_count():
    traffic = Traffic(np.random.default_rng(4))
    x = traffic.batch(8, 3.0)  # far off: three running standard deviations
    one = DriftWindow.model_validate(
        {
            "started_at": "2026-01-01T00:00:00Z",
            "ended_at": "2026-01-01T00:01:00Z",
            "requests": 1,
            "sampled": 1,
            "layers": [
                {
                    "name": "bn",
                    "count": x[:, 0].size,
                    "mean": x.mean((0, 2)).tolist(),
                    "var": x.var((0, 2)).tolist(),
                    "batches": 1,
                }
            ],
        }
    ).layers[0]
    assert traffic.alarms(one) == (True, False)
    hand_written = one.model_copy(update={"batches": None})
    assert traffic.alarms(hand_written) == (True, True)
    multiplier = error_multiplier(traffic.channels, None, RULE.false_alarm)
    assert math.isclose(multiplier, 3.78, abs_tol=0.01)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"se_var": None}, "se_mean and se_var together"),
        ({"batches": 1}, "need batches >= 2"),
        ({"batches": None}, "need batches >= 2"),
        ({"se_mean": [0.1]}, "se_mean has 1 channels and mean 2"),
        ({"se_var": [0.1, -0.1]}, "se_var must hold finite numbers of at least 0"),
        ({"se_mean": [0.1, float("nan")]}, "se_mean must hold finite numbers"),
        ({"batches": 11}, "batches=11 exceeds count=10"),
    ],
)
def test_standard_errors_a_window_cannot_stand_behind_are_refused_naming_the_field(change, message):
    from pydantic import ValidationError

    layer = {
        "name": "bn",
        "count": 10,
        "mean": [0.0, 1.0],
        "var": [1.0, 2.0],
        "batches": 2,
        "se_mean": [0.1, 0.2],
        "se_var": [0.1, 0.2],
    }
    body = {
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T00:01:00Z",
        "requests": 2,
        "sampled": 2,
        "layers": [layer],
    }
    assert DriftWindow.model_validate(body).layers[0].batches == 2
    with pytest.raises(ValidationError, match=message):
        DriftWindow.model_validate({**body, "layers": [{**layer, **change}]})
