"""`normbridge`: convert and check layers, inspect, port, export and monitor whole models, and run the registry.

Every command is a thin shell over the library (converters, registry); failures print one line
naming the layer and setting and exit non-zero (see schemas.errors.EXIT_CODES). Command modules are
imported here explicitly: tests/cli/test_cli.py::test_every_command_module_is_registered fails when a
module in cli/commands/ is missing from COMMAND_MODULES.
"""

from __future__ import annotations

from .app import app
from .commands import inspect, layers, mlflow_commands, monitoring, port, pull, registry, layer_export, service, serving  # noqa: F401  (each registers its commands on `app`, in this order)

COMMAND_MODULES = (layers, inspect, port, serving, monitoring, registry, pull, layer_export, service, mlflow_commands)

if __name__ == "__main__":  # pragma: no cover
    app()
