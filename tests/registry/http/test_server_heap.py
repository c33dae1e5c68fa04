"""A server that imports a framework for a registration settles its heap once (converters.heap), in a fresh interpreter.

Why it matters: after torch is imported, a full garbage collection scans its hundreds of thousands of objects and
pauses whatever request triggered it for 0.1-0.4 s. The test runs the real app (its routes, its registration lock)
in a child process that has not imported torch, and reads the collector's frozen count there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]

CHILD = textwrap.dedent("""
    import gc, json, sys
    from fastapi.testclient import TestClient
    from registry.http.app import create_app
    from registry.service import Registry

    folder, model = sys.argv[1], sys.argv[2]
    registry = Registry(db=f"sqlite:///{folder}/registry.db", blobs=f"{folder}/blobs")
    client = TestClient(create_app(registry, insecure_local=True, allowed_hosts=["testserver"]))
    seen = {"torch_before": "torch" in sys.modules, "frozen_before": gc.get_freeze_count()}
    body = open(model, "rb").read()

    class Marker:
        pass

    for round in ("first", "second"):
        answer = client.post("/api/v1/models/net/versions", params={"format": "pt2", "note": round}, content=body,
                             headers={"content-type": "application/octet-stream"})
        seen[round] = {"status": answer.status_code, "frozen": gc.get_freeze_count(), "torch": "torch" in sys.modules,
                       "marker_frozen": round == "second" and not any(o is marker for o in gc.get_objects())}
        marker = Marker()  # alive across the second registration: frozen only if that one settled the heap again
        marker.me = marker
    print(json.dumps(seen))
""")


def test_the_registration_that_imports_torch_settles_the_heap_and_a_later_one_does_not_settle_it_again(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    program = torch.export.export(model, (torch.randn(1, 3, 8, 8),))
    torch.export.save(program, tmp_path / "net.pt2")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), str(tmp_path / "net.pt2")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert not seen["torch_before"] and seen["frozen_before"] == 0
    assert seen["first"]["status"] == 201 and seen["first"]["torch"] and seen["first"]["frozen"] > 0
    assert seen["second"]["status"] in (200, 201)  # identical content: the existing version
    assert not seen["second"][
        "marker_frozen"
    ]  # it imported nothing new, so it left the heap as the first one settled it
