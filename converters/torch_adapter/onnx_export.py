"""Exporting a PyTorch model to ONNX for serving: torch.onnx.export(dynamo=True) with its graph optimizer off.

torch.onnx's optimizer runs onnxscript's `fuse_batchnorm`, which folds every eval BatchNorm into
the preceding Conv; neither eps nor the statistics could be checked afterwards (or monitored by
`drift`). Constants are folded and dead nodes removed instead.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from schemas import NormbridgeError, UnsupportedObjectError

from .torch_internals import torch_version

#: The lowest opset torch.onnx's dynamo exporter implements (torch/onnx/_internal/exporter/_constants.py,
#: TORCHLIB_OPSET). Asked for less, it exports at this one and converts with onnxscript, logging a traceback and keeping
#: this opset when that fails; so it is asked for at least this, and the serving export converts down to the cap
#: (models/serving/opset.py).
TORCH_ONNX_MIN_OPSET = 18


def _clean(model):
    """Fold constants and drop dead nodes (what torch.onnx's optimizer does, minus folding BatchNorm into Conv)."""
    import onnxscript.optimizer

    onnxscript.optimizer.fold_constants(model)
    onnxscript.optimizer.remove_unused_nodes(model)
    return model


def _tensors(arrays) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)


def export_onnx(model, sample, opset: int) -> tuple[Any, str, list[str]]:
    """(onnx.ModelProto, the exporter as named in reports, notes) for an nn.Module
    (with a dynamic batch when it allows one) or an ExportedProgram."""
    notes = [
        "torch.onnx's graph optimizer is off (it folds BatchNorm into Conv, losing eps and statistics); constants folded instead"
    ]
    opset = max(opset, TORCH_ONNX_MIN_OPSET)
    options = {"dynamo": True, "opset_version": opset, "optimize": False, "verbose": False}
    name = f"torch.onnx.export(dynamo=True, optimize=False) torch {torch_version()} at opset {opset}"
    try:
        if isinstance(model, torch.export.ExportedProgram):
            program = torch.onnx.export(model, **options)
        else:
            rows = (
                sample.rows(slice(0, 2))
                if sample.batch_size >= 2
                else tuple(np.concatenate([a, a]) for a in sample.arrays)
            )
            args = _tensors(rows)
            batch = torch.export.Dim("batch", min=1)
            try:
                program = torch.onnx.export(model, args, dynamic_shapes=tuple({0: batch} for _ in args), **options)
            except Exception as error:  # a model that fixes its batch size: export it with the sample's
                notes.append(
                    f"exported with a fixed batch of {sample.batch_size}: a dynamic batch failed ({type(error).__name__})"
                )
                program = torch.onnx.export(model, _tensors(sample.arrays), **options)
    except NormbridgeError:
        raise
    except Exception as error:
        raise UnsupportedObjectError(
            f"torch.onnx.export failed at opset {opset} ({exporter_failure(error)}): the exporter's own failure, before normbridge "
            "sees a graph, so nothing was written and no normalization was checked in ONNX; `normbridge register` checks each "
            "normalization layer without exporting the whole model, or export a submodule that torch.onnx handles."
        ) from error
    return _clean(program.model_proto), name, notes


#: Terminal colour codes torch.onnx puts in its messages.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def exporter_failure(error: BaseException) -> str:
    """torch.onnx's error in one line: its step, the underlying exception (its 'Exception summary') and the user code it
    ran."""
    text = _ANSI.sub("", str(error)).strip()
    step = re.search(r"step (\d)/3", text)
    where = f"step {step.group(1)} of 3, {_STEPS.get(step.group(1), '')}: " if step else ""
    cause = error.__cause__ or error
    cause_text = _ANSI.sub("", str(cause)).strip()
    first = next((line.strip() for line in cause_text.splitlines() if line.strip()), type(cause).__name__)
    frames = re.findall(r'File "([^"]+)", line (\d+)', cause_text)
    at = f", at {frames[-1][0].split('site-packages/')[-1]} line {frames[-1][1]}" if frames else ""
    return f"{where}{type(cause).__name__}: {first[:300]}{at}"


#: torch.onnx.export's three steps, as its messages number them.
_STEPS = {
    "1": "capturing the model with torch.export",
    "2": "decomposing the graph for ONNX",
    "3": "translating it to ONNX",
}
