"""The toy framework's adapter package: `INFO`, `FRAMEWORK`, `KIND_ADAPTERS` (one module per kind) and no `MODEL`."""

from converters.adapter import kind_adapters
from converters.framework_info import FrameworkInfo

from .framework import ToyFramework

INFO = FrameworkInfo(
    name="toynp",
    package=__name__,
    default_eps_name="toynp's default",
    model_files={},  # whole models of it are not read
    structure_format=None,
    structure_suffix=None,
    empty_batch="keeps them",
    object_origin="module",
)
FRAMEWORK = ToyFramework()
KIND_ADAPTERS = kind_adapters(__name__)
