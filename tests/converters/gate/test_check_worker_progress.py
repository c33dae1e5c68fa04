"""A worker's job sends its progress frames throttled: each step's first and last always, the rest at most every
PROGRESS_INTERVAL, anything not shaped [step, done, total] always; the answer follows them all.

Real `check_worker.serve` over in-memory streams, with jobs written here (no framework is needed for a job's frames).
"""

from __future__ import annotations

import io
import json
import time

from converters.gate import check_worker
from converters.adapters import REGISTRY
from converters.gate.check_worker import read_frame, serve, write_frame


def _frames_of(jobs: dict, name: str) -> list[dict]:
    requests, replies = io.BytesIO(), io.BytesIO()
    write_frame(requests, json.dumps({"job": name, "args": {}}).encode())
    write_frame(requests, b"")
    requests.seek(0)
    serve(requests, replies, REGISTRY, jobs=jobs)
    replies.seek(0)
    frames = []
    while (frame := read_frame(replies)) is not None:
        frames.append(json.loads(frame))
    return frames


def test_a_fast_step_sends_its_first_and_last_frame_and_few_between():
    def job(args, progress):
        for i in range(2001):
            progress(["checking", i, 2000])
        progress(["committing", 0, 1])
        return {"ok": True}

    frames = _frames_of({"fast": job}, "fast")
    progress = [frame["progress"] for frame in frames[:-1]]
    assert frames[-1] == {"done": {"ok": True}}
    assert (
        progress[0] == ["checking", 0, 2000]
        and ["checking", 2000, 2000] in progress
        and progress[-1] == ["committing", 0, 1]
    )
    assert len(progress) < 100  # 2002 reports in far less than 100 intervals


def test_a_slow_step_sends_a_frame_per_interval_and_other_frames_always():
    def job(args, progress):
        for i in range(1, 4):
            time.sleep(check_worker.PROGRESS_INTERVAL * 1.5)
            progress(["storing blobs", i, 10])
        for _ in range(3):
            progress(["a note"])
        return {"ok": True}

    progress = [frame["progress"] for frame in _frames_of({"slow": job}, "slow")[:-1]]
    assert progress == [["storing blobs", 1, 10], ["storing blobs", 2, 10], ["storing blobs", 3, 10]] + [["a note"]] * 3
