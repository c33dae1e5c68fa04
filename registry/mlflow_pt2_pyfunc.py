"""MLflow's pyfunc loader for a pushed `.pt2`: copied into the MLflow model's code/ folder, run where MLflow serves it.

MLflow's own pytorch flavour cannot serve a transformers program: `torch.export.load` needs the program's output
classes registered as pytree nodes (registration happens when their module is imported, which nothing does), and its
predict calls the program with one positional tensor, while a transformers model takes `pixel_values=`. This loader
imports the modules push recorded (model_config "pytree_modules"), loads the program with torch's own reader, and
calls it with each input by the name the program was exported with. It imports nothing of normbridge: the serving
environment needs only the requirements push wrote.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import torch
from torch.utils import _pytree as pytree

PROGRAM_FILE = "model.pt2"


def _load_pyfunc(data_path: str, model_config: dict | None = None) -> "ProgramModel":
    """The program in `data_path`/model.pt2, after importing the modules that register its input and output classes."""
    for module in (model_config or {}).get("pytree_modules", []):
        importlib.import_module(module)
    return ProgramModel(torch.export.load(os.path.join(data_path, PROGRAM_FILE)))


class ProgramModel:
    """What `mlflow.pyfunc` calls `predict` on: arrays by input name in, arrays by output name out."""

    def __init__(self, program):
        self.program = program
        self.module = program.module()
        placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
        # A user input that is not a name is a constant the program was exported with (use_cache=False): passed again.
        self.inputs = [
            (name, placeholders[name].meta["val"].dtype)
            for name in program.graph_signature.user_inputs
            if isinstance(name, str)
        ]

    def predict(self, model_input, params=None):
        arrays = self._arrays(model_input)
        given = iter(torch.from_numpy(np.ascontiguousarray(arrays[name])).to(dtype) for name, dtype in self.inputs)
        leaves = [next(given) if isinstance(name, str) else name for name in self.program.graph_signature.user_inputs]
        args, kwargs = pytree.tree_unflatten(leaves, self.program.call_spec.in_spec)
        with torch.no_grad():
            outputs = self.module(*args, **kwargs)
        named = [
            (_name(path), leaf)
            for path, leaf in pytree.tree_flatten_with_path(outputs)[0]
            if isinstance(leaf, torch.Tensor)
        ]
        if len(named) == 1:
            return named[0][1].numpy()
        return {name or f"output_{i}": leaf.numpy() for i, (name, leaf) in enumerate(named)}

    def _arrays(self, model_input) -> dict:
        """Input name -> array, from a dict of arrays, one array (a single-input program) or a pandas DataFrame."""
        names = [name for name, _ in self.inputs]
        if hasattr(model_input, "to_dict") and hasattr(model_input, "columns"):  # a DataFrame: one column per input
            model_input = {column: np.stack(model_input[column].to_numpy()) for column in model_input.columns}
        if isinstance(model_input, dict):
            missing = [name for name in names if name not in model_input]
            if missing and len(names) == 1 and len(model_input) == 1:
                return {names[0]: np.asarray(next(iter(model_input.values())))}
            if missing:
                raise ValueError(f"the model takes inputs {names}; missing {missing}")
            return {name: np.asarray(model_input[name]) for name in names}
        if len(names) != 1:
            raise ValueError(f"the model takes inputs {names}: pass them by name")
        return {names[0]: np.asarray(model_input)}


def _name(path) -> str:
    """'last_hidden_state' for the key path of a named output, '0.1' for positions."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
    return ".".join(parts)
