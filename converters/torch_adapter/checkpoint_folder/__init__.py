"""A Hugging Face checkpoint folder (what `save_pretrained` and `Trainer` write) as a model source, read safely.

`folder_checks.py` says what such a folder may hold (no pickles, no Python files, no symlink leaving it);
`safetensors_index.py` lists its shards and each tensor's byte range from the safetensors headers, checked against the
files' sizes; `meta_model.py` builds the architecture named by `config.json` through transformers' own classes on the
meta device (no weight allocated, no remote code run) and loads, by byte range, only the tensors of its normalization
modules, so the recognizers that read a live torch module read and prove them (`load_checkpoint_folder`, imported on
first use: the folder checks and the safetensors index do not import torch).
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "load_checkpoint_folder":
        from .meta_model import load_checkpoint_folder

        return load_checkpoint_folder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["load_checkpoint_folder"]
