"""Keras loaded without the optional packages it would import for features normbridge never uses,
in normbridge's own processes.

Why: where scikit-learn, matplotlib and pandas are installed (MLflow brings all three), `import keras` on TensorFlow
imports them through Keras's optional integrations (its scikit-learn wrappers, its image gallery, pandas inputs to
`fit`): 2.2 s of the 6 s a cold CLI process or gate worker spends importing Keras and TensorFlow. Keras wraps each of
those imports in `try/except ImportError` and runs as on a machine without them; no layer computes with them, so every
check's numbers are the same. Only normbridge's own processes opt in, by NORMBRIDGE_LEAN_IMPORTS=1 unless the user set
it (0 turns it off): the CLI sets it (without importing this package), the gate's workers call `enable`; a program that
imports normbridge as a library keeps its environment as it is. Once Keras is in, the packages import normally (only
Keras's own optional hooks stay off in that process).
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: Top-level packages kept out while Keras first loads.
OPTIONAL_PACKAGES = ("sklearn", "matplotlib", "pandas")
#: "1": this process opted in; "0": kept as it is.
ENV = "NORMBRIDGE_LEAN_IMPORTS"


def enable() -> None:
    """In this process, load Keras without OPTIONAL_PACKAGES, unless the user set NORMBRIDGE_LEAN_IMPORTS=0."""
    os.environ.setdefault(ENV, "1")


@contextmanager
def optional_packages_kept_out() -> Iterator[None]:
    """While the block runs, importing any of OPTIONAL_PACKAGES fails as if it were not installed (when `enable`d)."""
    if os.environ.get(ENV) != "1":
        yield
        return
    finder = _Absent()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in OPTIONAL_PACKAGES:
            raise ModuleNotFoundError(
                f"No module named '{name}' (kept out while Keras loads in a normbridge process)", name=name
            )
        return None


__all__ = ["ENV", "OPTIONAL_PACKAGES", "enable", "optional_packages_kept_out"]
