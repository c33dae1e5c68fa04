"""Which pip extra brings each optional package normbridge imports, so a missing one is a one-line error naming it.

The core install (numpy, pydantic, safetensors, typer, rich, SQLAlchemy, Alembic, httpx) runs every command's parsing
and the registry's SQLite store; each framework and service comes with an extra of pyproject.toml.
`tests/test_extras.py` holds this table to pyproject.toml (every package listed in its extra) and to the code (every
third-party import outside the core is listed here).
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import MissingDependencyError


class Optional(NamedTuple):
    """An optional top-level module: the extra that installs it and the distribution pip installs it from."""

    extra: str
    distribution: str


#: Top-level module name -> where it comes from.
OPTIONAL_MODULES: dict[str, Optional] = {
    "torch": Optional("torch", "torch"),
    "keras": Optional("keras", "keras"),
    "tensorflow": Optional("keras", "tensorflow-cpu"),
    "h5py": Optional("keras", "keras"),  # Keras's own dependency: its .weights.h5 files
    "tf2onnx": Optional("keras", "tf2onnx"),
    "onnx": Optional("onnx", "onnx"),
    "onnxruntime": Optional("onnx", "onnxruntime"),
    "onnxscript": Optional("onnx", "onnxscript"),
    "google": Optional("onnx", "onnx"),  # protobuf, onnx's own dependency: its message classes
    "fastapi": Optional("server", "fastapi"),
    "starlette": Optional("server", "fastapi"),  # FastAPI's own dependency
    "uvicorn": Optional("server", "uvicorn"),
    "jinja2": Optional("server", "jinja2"),
    "fastapi_offline": Optional("server", "fastapi-offline"),
    "prometheus_client": Optional("server", "prometheus_client"),
    "psycopg2": Optional("postgres", "psycopg2-binary"),
    "boto3": Optional("s3", "boto3"),
    "botocore": Optional("s3", "boto3"),  # boto3's own dependency
    "mlflow": Optional("mlflow", "mlflow"),
    "transformers": Optional("huggingface", "transformers"),  # Hugging Face checkpoint folders (`inspect DIR`)
    "yaml": Optional("mlflow", "mlflow"),  # MLflow's own dependency: its MLmodel files
    "packaging": Optional("mlflow", "mlflow"),  # MLflow's own dependency: the versions `mlflow push` pins
}


def missing_dependency(error: ModuleNotFoundError, purpose: str | None = None) -> MissingDependencyError | None:
    """The MissingDependencyError naming the extra for a ModuleNotFoundError of an optional package; None for any other
    module (a broken install of normbridge itself, which stays a crash with its traceback)."""
    top = (error.name or "").split(".")[0]
    known = OPTIONAL_MODULES.get(top)
    if known is None:
        return None
    needed = f" for {purpose}" if purpose else ""
    return MissingDependencyError(
        f"the Python package '{top}' is not installed{needed}; install it with pip install "
        f"'normbridge[{known.extra}]' (or pip install {known.distribution}) and try again.",
        setting=known.extra,
    )


__all__ = ["OPTIONAL_MODULES", "Optional", "missing_dependency"]
