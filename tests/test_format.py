"""The code is formatted by ruff at the line length pyproject.toml sets (`make format` rewrites it): a file it would
change fails here, naming the file, so formatting never drifts between contributors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_python_file_is_formatted() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"run `make format`:\n{result.stdout}{result.stderr}"


def test_the_check_fails_on_an_unformatted_file(tmp_path: Path) -> None:
    """The check above can fail: ruff with the project's settings refuses a file it would rewrite."""
    bad = tmp_path / "bad.py"
    bad.write_text("x = [1,2,\n  3]\n")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--config", str(ROOT / "pyproject.toml"), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "bad.py" in result.stdout + result.stderr
