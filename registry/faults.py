"""Fault injection for crash-safety tests: die at a named step of a registration.

A registration writes blobs, then commits one transaction; the tests kill the process between
those steps (env NORMBRIDGE_FAULT=<point>) and show that nothing half-written becomes visible.
`os._exit` skips every cleanup handler, like a SIGKILL or a power cut would.
"""

from __future__ import annotations

import os

#: The named points, in the order a registration passes them.
FAULT_POINTS = ("after_check", "after_blobs", "after_commit")
FAULT_ENV = "NORMBRIDGE_FAULT"
FAULT_EXIT = 137


def fault_point(name: str) -> None:
    """Die at once (exit 137, no cleanup) when env NORMBRIDGE_FAULT equals `name`; otherwise do nothing."""
    if os.environ.get(FAULT_ENV) == name:
        os._exit(FAULT_EXIT)


__all__ = ["FAULT_ENV", "FAULT_EXIT", "FAULT_POINTS", "fault_point"]
