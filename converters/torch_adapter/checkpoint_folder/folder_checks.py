"""What a Hugging Face checkpoint folder may hold before anything in it is read.

Refused, each with one sentence naming the file and what to do: pickled files (`pytorch_model.bin`, `.pt`, `.pth`,
`.ckpt`, `.pkl`: unpickling runs code), Python files (`modeling_*.py`: a folder carrying its own code is what
`trust_remote_code` runs, and normbridge never does), symlinks whose target is outside the folder (the Hugging Face
cache's snapshot folders link into its blob store: copy them with `cp -rL`), and a folder with no safetensors weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from schemas import InputFileError

CONFIG = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".so")
#: More entries than any checkpoint holds (weights, shards, tokenizer, generation config): a bound on the walk.
MAX_ENTRIES = 100_000

CONVERT = (
    "convert it to safetensors where you trust it: "
    "`AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`, then remove the pickle"
)


@dataclass(frozen=True)
class CheckedFolder:
    """A folder whose entries passed the checks, and where its weights are named."""

    root: Path
    config: Path
    index: Path | None  # model.safetensors.index.json for a sharded checkpoint, else None
    single: Path | None  # model.safetensors for a one-file checkpoint, else None


def check_folder(path: Path) -> CheckedFolder:
    """The folder's weights, once every entry in it is allowed; InputFileError naming the first that is not."""
    root = path.resolve()
    for entry in _entries(path):
        _check_entry(path, root, entry)
    config = path / CONFIG
    if not config.is_file():
        raise InputFileError(f"'{path}' has no {CONFIG}; save the checkpoint with `model.save_pretrained(dir)`.")
    index, single = path / INDEX, path / SINGLE_FILE
    if index.is_file():
        return CheckedFolder(path, config, index, None)
    if single.is_file():
        return CheckedFolder(path, config, None, single)
    raise InputFileError(
        f"'{path}' holds no {SINGLE_FILE} nor {INDEX}; save the weights with "
        "`model.save_pretrained(dir, safe_serialization=True)`."
    )


def _entries(path: Path) -> list[Path]:
    """Every entry under `path`, not following symlinked folders (a link is checked as a link, never walked)."""
    found: list[Path] = []
    for folder, folders, files in os.walk(path, followlinks=False):
        found += [Path(folder) / name for name in (*folders, *files)]
        if len(found) > MAX_ENTRIES:
            raise InputFileError(f"'{path}' holds more than {MAX_ENTRIES} files; pass the checkpoint's own folder.")
    return sorted(found)


def _check_entry(path: Path, root: Path, entry: Path) -> None:
    shown = entry.relative_to(path)
    if entry.is_symlink():
        try:
            target = entry.resolve(strict=True)
        except (OSError, RuntimeError):  # RuntimeError: a loop of links, on Python 3.11
            raise InputFileError(
                f"'{path}/{shown}' is a symlink that leads nowhere (a missing target or a loop); remove it."
            ) from None
        if not target.is_relative_to(root):
            raise InputFileError(
                f"'{path}/{shown}' is a symlink to '{target}', outside the folder; copy the folder with its files "
                "(`cp -rL SOURCE DEST`) and pass the copy."
            )
    suffix = entry.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise InputFileError(
            f"'{path}/{shown}' is a pickle ('{suffix}'), which normbridge never loads (unpickling can run code); "
            f"{CONVERT}."
        )
    if suffix in CODE_SUFFIXES:
        raise InputFileError(
            f"'{path}/{shown}' is code, which normbridge never runs (a folder carrying its own model code needs "
            "trust_remote_code); remove it, or use an architecture transformers ships."
        )
    if not (entry.is_file() or entry.is_dir()):
        raise InputFileError(
            f"'{path}/{shown}' is neither a file nor a folder (a device, a socket, a fifo or a broken link); remove it."
        )


__all__ = ["CONFIG", "INDEX", "SINGLE_FILE", "CheckedFolder", "check_folder"]
