"""Seeded mutations of a genuine `.pt2`: normbridge's reader either reads each one or refuses it as a bad input file.

A fuzz of 6,000 mutations (issue 30, item 11) found exceptions of other types escaping the reader (a TypeError in
pt2/treespecs.py, another in pt2/archive.py, a NotImplementedError from a meta-device weight), which the server answered
with a 500 and the CLI with a traceback. Each case here is a genuine archive (tests.pt2_fuzzing.FuzzNet: a dynamic
batch, so shape expressions, a mapped 1.2 MB payload, a stride-0 buffer, a constant) with one to three mutations from
`random.Random(f"{seed}:{index}")`, read through `load_model` in a separate process that reports each case as it starts
and ends, so a case that hangs fails the test (PER_CASE_SECONDS) instead of stalling it. Every outcome must be a
successful read or an InputFileError (bad_input_file) whose message names the file.

NORMBRIDGE_PT2_FUZZ_CASES (default 400) and NORMBRIDGE_PT2_FUZZ_SEED (default 31) run more cases or others; a failure
names the seed and the case, which `tests.pt2_fuzzing.mutated` rebuilds.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pt2_fuzzing import genuine_fuzz_base

pytestmark = pytest.mark.slow  # a process reads the cases

ROOT = Path(__file__).resolve().parents[2]
CASES = int(os.environ.get("NORMBRIDGE_PT2_FUZZ_CASES", "400"))
SEED = int(os.environ.get("NORMBRIDGE_PT2_FUZZ_SEED", "31"))
PER_CASE_SECONDS = 20.0  # a case takes tens of milliseconds; the first waits for torch's imports in the reading process
START_SECONDS = 180.0


def _outcomes(genuine: Path, folder: Path) -> list[dict]:
    """Each case's last line from the reading process; fails at the first case that does not end within
    PER_CASE_SECONDS."""
    with open(
        folder / "stderr.txt", "w+"
    ) as errors:  # a file, not a pipe: warnings must never fill a buffer and stall the reader
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.pt2_fuzzing", str(genuine), str(SEED), "0", str(CASES), str(folder)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,
        )
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        finished, running, deadline = [], None, time.monotonic() + START_SECONDS
        try:
            while len(finished) < CASES:
                if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    if running is None:
                        pytest.fail(f"the reading process did not start a case within {START_SECONDS} s")
                    pytest.fail(
                        f"seed {SEED}, case {running['case']} ({running['started']}) did not finish within "
                        f"{PER_CASE_SECONDS} s: the reader hangs on it"
                    )
                line = process.stdout.readline()
                if not line:
                    errors.seek(0)
                    pytest.fail(
                        f"the reading process ended after {len(finished)} cases (exit {process.wait(timeout=30)}): "
                        f"{errors.read()[-3000:]}"
                    )
                if not line.startswith("{"):
                    continue  # something a library printed
                record = json.loads(line)
                if "started" in record:
                    running, deadline = record, time.monotonic() + PER_CASE_SECONDS
                else:
                    finished.append(record)
            return finished
        finally:
            selector.close()
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
            process.stdout.close()


def test_every_mutation_of_a_genuine_archive_is_read_or_refused_as_a_bad_input_file(tmp_path):
    genuine = genuine_fuzz_base(tmp_path / "genuine.pt2")
    cases = tmp_path / "cases"
    cases.mkdir()
    outcomes = _outcomes(genuine, cases)
    wrong = [
        o
        for o in outcomes
        if o["outcome"] == "crashed"
        or (
            o["outcome"] == "refused" and (o["code"] != "bad_input_file" or f"case-{o['case']}.pt2" not in o["message"])
        )
    ]
    assert not wrong, (
        f"seed {SEED}: {len(wrong)} of {len(outcomes)} cases escaped the reader's refusals, first: "
        + json.dumps(wrong[0], indent=1)[:4000]
    )
    counts = {kind: sum(o["outcome"] == kind for o in outcomes) for kind in ("read", "refused")}
    assert counts["refused"] > CASES // 2, counts  # the mutations do reach the reader's checks
