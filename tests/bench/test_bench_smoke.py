"""bench/convert.py runs end to end (one repetition) and its non-timing claims hold.

Timings are printed by the benchmark, never asserted here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

BENCH = Path(__file__).resolve().parents[2] / "bench" / "convert.py"


def test_convert_benchmark_runs_and_normbridge_emits_native_ops_with_exact_eps():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--repeat-normbridge", "1", "--repeat-anchor", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "normbridge native ops only: True" in done.stdout
    assert "mismatches: normbridge 0" in done.stdout
    for kind in ("batch", "layer", "rms", "group", "instance"):
        assert f"{kind:<9} normbridge" in done.stdout


def test_monitor_benchmark_runs_and_reports_both_sides():
    bench = BENCH.parent / "monitor.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--rounds", "1", "--per-round", "10", "--size", "32", "--sample-rate", "0.5"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "53 BatchNorms, 25.6M parameters" in done.stdout
    assert "without monitor" in done.stdout and "with monitor" in done.stdout and "added latency p99" in done.stdout
