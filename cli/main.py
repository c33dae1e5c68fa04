"""`normbridge`: convert, check and inspect normalization layers from the command line.

Every command is a thin shell over the library; failures print one line naming the
layer and setting and exit non-zero (see schemas.errors.EXIT_CODES). Command modules are
imported here explicitly: a module missing from this list is caught by tests/test_cli.py.
"""

from __future__ import annotations

from .app import app
from .commands import inspect, layers, mlflow_commands, monitoring, port, registry, service, serving  # noqa: F401  (each registers its commands on `app`)

COMMAND_MODULES = (layers, inspect, port, serving, monitoring, registry, service, mlflow_commands)

if __name__ == "__main__":  # pragma: no cover
    app()
