"""Reading a layer from disk without executing code (writing one is converters.write_layer).

Accepted inputs: a spec folder (spec.json + tensors.safetensors) or an .onnx file with one
normalization layer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from schemas import InputFileError, load_spec


def load_layer(path: Path) -> Any:
    """A NormSpec (spec folder) or an onnx.ModelProto (.onnx file)."""
    if not path.exists():
        raise InputFileError(
            f"'{path}' does not exist; pass a spec folder (spec.json + tensors.safetensors) or an .onnx file."
        )
    if path.is_dir() or path.name == "spec.json":
        return load_spec(path)
    if path.suffix == ".onnx":
        from converters.models.file_headers import check_onnx_header
        from converters.onnx_adapter.files import load_onnx

        check_onnx_header(path)

        return load_onnx(path)
    raise InputFileError(
        f"'{path}' is neither a spec folder nor an .onnx file; pickled and other formats are refused because loading them can execute code."
    )


def check_headers(models: tuple[Path, ...] = (), samples: tuple[Path | None, ...] = ()) -> None:
    """Refuse every model and sample file whose first bytes do not match its suffix, before any framework loads one."""
    from converters.models.file_headers import check_model_header, check_sample_header

    for path in models:
        check_model_header(path)
    for path in samples:
        if path is not None:
            check_sample_header(path)


def output_path(path: Path, *, suffix: str | None = None, folder: bool = False) -> Path:
    """Refuse, before any work, an output that does not end in `suffix` (a usage error, exit 2) or that cannot be
    written (schemas.atomic_io.writable: exit 24): an export that ran for minutes no longer fails at its last step."""
    import typer

    from schemas.atomic_io import writable

    if suffix is not None and path.suffix.lower() != suffix:
        if path.is_dir() or str(path).endswith(("/", os.sep)):
            raise typer.BadParameter(
                f"'{path}' is a folder; the output is one {suffix} file: pass -o {path / ('model' + suffix)}.",
                param_hint="--output",
            )
        raise typer.BadParameter(
            f"'{path}' does not end in {suffix}; pass -o {path.with_suffix(suffix) if path.suffix else str(path) + suffix}.",
            param_hint="--output",
        )
    return writable(path, folder=folder)
