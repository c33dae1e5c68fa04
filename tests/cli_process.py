"""The `normbridge` command as a user runs it: the installed console script (or `python -m cli.main`)."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "normbridge"


def normbridge_command() -> list[str]:
    """argv prefix that runs the real command in a new process."""
    return [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "cli.main"]
