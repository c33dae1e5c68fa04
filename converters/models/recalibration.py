"""Recalibration: re-estimate BatchNorm running statistics on new data, weights untouched.

The new statistics are PyTorch's cumulative average (momentum=None) over the given batches:
running_mean = mean over batches of the batch mean, running_var = mean over batches of the
unbiased batch variance, each batch weighted equally, with every BatchNorm normalizing by its
batch statistics during the pass (as in training). Other layers run in eval mode (no dropout),
no gradient is computed and nothing but the running statistics changes.

- torch.nn.Module: PyTorch itself does it, on a deep copy: reset_running_stats, momentum=None,
  BatchNorm layers in train mode; afterwards each layer's momentum and every module's mode are
  restored.
- ExportedProgram (.pt2): an FX interpreter runs the program with batch statistics and records
  each BatchNorm input; the averages are computed in float64 and rounded once to float32 into a
  copy of the program's state dict. The graph is unchanged, so the program stays what it was
  with new buffers; PyTorch's own incremental float32 average agrees to float32 rounding.
- ONNX: a copy with every BatchNormalization in training_mode=1 exposes each node's input as
  a graph output in onnxruntime; the averages replace the node's mean and variance initializers.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError
from schemas.serving import RecalibratedLayer, RecalibrationReport

from .drift import (
    LayerMoments,
    batchnorm_modules,
    batchnorm_moments,
    data_batches,
    describe,
    first_line,
    onnx_batchnorms,
)
from .loading import framework_of_model

DEFAULT_BATCH_SIZE = 32


def _as_batches(model: Any, batches: Any, batch_size: int | None) -> list[tuple[np.ndarray, ...]]:
    """A list of batches (each a tuple of arrays, one per input) from batches or from data to split."""
    if isinstance(batches, (list, tuple)) and batches and not isinstance(batches[0], (int, float)):
        out = []
        for batch in batches:
            arrays = batch if isinstance(batch, (list, tuple)) else (batch,)
            out.append(tuple(np.asarray(a.detach().numpy() if hasattr(a, "detach") else a) for a in arrays))
        return out
    _, split = data_batches(model, batches, batch_size or DEFAULT_BATCH_SIZE)
    return split


def cumulative_statistics(moments: LayerMoments, variance_estimator: str = "unbiased") -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's momentum=None running statistics from per-batch moments (float64)."""
    means = np.stack(moments.means)
    variances = np.stack(moments.variances)
    if variance_estimator == "unbiased":
        counts = np.asarray(moments.counts, dtype=np.float64)[:, None]
        if np.any(counts < 2):
            raise InputFileError(f"layer '{moments.name}': a batch with one value per channel has no unbiased variance; use batches of at least 2.")
        variances = variances * counts / (counts - 1)
    return means.mean(0), variances.mean(0)


def _movement(name: str, old_mean, old_var, new_mean, new_var, eps: float) -> RecalibratedLayer:
    old_mean, old_var, new_mean, new_var = (np.asarray(a, dtype=np.float64) for a in (old_mean, old_var, new_mean, new_var))
    shift = np.abs(new_mean - old_mean) / np.sqrt(old_var + eps)
    ratio = np.abs(np.log((new_var + eps) / (old_var + eps)))
    return RecalibratedLayer(name=name, channels=int(old_mean.shape[0]), max_mean_shift=float(shift.max()), max_abs_log_var_ratio=float(ratio.max()))


NOT_REGISTERED = "not registered: the artifact registry does not exist yet (lineage 'recalibrated' comes with it)"


def recalibrate(model: Any, batches: Any, *, batch_size: int | None = None, variance_estimator: str = "unbiased") -> tuple[Any, RecalibrationReport]:
    """Re-estimate every BatchNorm's running statistics on `batches`; returns (new model, report). The input model is not modified.

    Args:
        model: torch.nn.Module, torch ExportedProgram, keras.Model or onnx.ModelProto.
        batches: a list of batches (arrays, or tuples of arrays for several inputs), or data to split
            into batches of `batch_size` (an array, a .npy/.npz path, a Sample).
        variance_estimator: "unbiased" (PyTorch) or "biased" (Keras/ONNX training); not for an nn.Module (PyTorch's own is unbiased).
    """
    if variance_estimator not in ("unbiased", "biased"):
        raise InputFileError(f"variance_estimator '{variance_estimator}' is unknown; pass 'unbiased' (PyTorch) or 'biased' (Keras, ONNX).")
    framework = framework_of_model(model)
    split = _as_batches(model, batches, batch_size)
    if not split:
        raise InputFileError("no batches given; pass at least one batch of new data.")
    samples = sum(int(b[0].shape[0]) for b in split)
    if framework == "onnx":
        new_model, layers, method = _recalibrate_onnx(model, split, variance_estimator)
    elif framework == "torch":
        import torch

        if isinstance(model, torch.export.ExportedProgram):
            new_model, layers, method = _recalibrate_program(model, split, variance_estimator)
        elif isinstance(model, torch.nn.Module):
            if variance_estimator != "unbiased":
                raise InputFileError("a torch.nn.Module is recalibrated by PyTorch itself, which uses the unbiased variance; leave variance_estimator='unbiased'.")
            new_model, layers, method = _recalibrate_module(model, split)
        else:
            raise UnsupportedObjectError(f"got a {type(model).__name__}; expected a torch.nn.Module or ExportedProgram.")
    elif framework == "keras":
        from .recalibration_keras import recalibrate_keras

        new_model, moved, method = recalibrate_keras(model, split, variance_estimator)
        layers = [_movement(*entry) for entry in moved]
    else:
        raise UnsupportedObjectError(f"recalibration supports torch modules, .pt2 programs, Keras and ONNX models; got a {framework} model.")
    if not layers:
        raise UnsupportedObjectError(f"{describe(model)} has no BatchNorm layer with running statistics to recalibrate.")
    report = RecalibrationReport(model=describe(model), framework=framework, method=method, batches=len(split), samples=samples,
                                 variance_estimator=variance_estimator, layers=layers, notes=[NOT_REGISTERED])
    return new_model, report


def _recalibrate_module(module, batches: list[tuple[np.ndarray, ...]]):
    import torch

    new = copy.deepcopy(module)
    modes = {name: m.training for name, m in new.named_modules()}
    layers = batchnorm_modules(new)
    before = {name: (bn.running_mean.detach().clone(), bn.running_var.detach().clone()) for name, bn in layers}
    momenta = {}
    new.eval()
    for name, bn in layers:
        momenta[name] = bn.momentum
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    try:
        with torch.no_grad():
            for batch in batches:
                try:
                    new(*[torch.from_numpy(np.ascontiguousarray(a)) for a in batch])
                except (ValueError, RuntimeError) as error:  # e.g. one value per channel in train mode
                    raise InputFileError(f"the model refused a recalibration batch of shape {[list(a.shape) for a in batch]} ({first_line(error)}).") from error
    finally:
        for name, bn in layers:
            bn.momentum = momenta[name]
        for name, m in new.named_modules():
            m.training = modes[name]
    moved = [_movement(name, *before[name], bn.running_mean.detach(), bn.running_var.detach(), float(bn.eps)) for name, bn in layers]
    method = ("PyTorch train-mode forwards of a deep copy with reset statistics and momentum=None (cumulative average over batches); "
              "other layers in eval mode, no gradients; momentum and modes restored")
    return new, moved, method


def _recalibrate_program(program, batches, variance_estimator: str):
    import torch

    moments = batchnorm_moments(program, batches, train=True)
    new = copy.deepcopy(program)
    state = new.state_dict
    moved = []
    for record in moments:
        keys = (f"{record.name}.running_mean", f"{record.name}.running_var")
        if not all(k in state for k in keys):
            raise UnsupportedObjectError(f"layer '{record.name}': its running statistics are not buffers of the program's state dict; recalibrate the nn.Module and export again.")
        mean, var = cumulative_statistics(record, variance_estimator)
        with torch.no_grad():
            state[keys[0]].copy_(torch.from_numpy(mean).to(state[keys[0]].dtype))
            state[keys[1]].copy_(torch.from_numpy(var).to(state[keys[1]].dtype))
            tracked = f"{record.name}.num_batches_tracked"
            if tracked in state:
                state[tracked].fill_(len(batches))
        moved.append(_movement(record.name, record.running_mean, record.running_var, mean, var, record.eps))
    method = ("FX interpreter over the program with BatchNorm on batch statistics; average over batches of batch mean and "
              f"{variance_estimator} batch variance in float64, rounded once to float32 into the state dict (graph unchanged)")
    return new, moved, method


def _recalibrate_onnx(model, batches, variance_estimator: str):
    from onnx import numpy_helper

    sites = onnx_batchnorms(model)
    moments = batchnorm_moments(model, batches, train=True)
    new = copy.deepcopy(model)
    initializers = {init.name: init for init in new.graph.initializer}
    uses: dict[str, int] = {}
    for node in new.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    moved = []
    for site, record in zip(sites, moments):
        mean, var = cumulative_statistics(record, variance_estimator)
        node = new.graph.node[site.index]
        for slot, tensor_name, value in ((3, site.mean_name, mean), (4, site.var_name, var)):
            old = initializers.get(tensor_name)
            dtype = numpy_helper.to_array(old).dtype if old is not None else np.float32
            array = value.astype(dtype)
            if old is not None and uses.get(tensor_name, 0) == 1:
                old.CopyFrom(numpy_helper.from_array(array, tensor_name))
            else:  # shared or a Constant node: give this node its own initializer
                fresh = f"{site.name}.{'running_mean' if slot == 3 else 'running_var'}.recalibrated"
                new.graph.initializer.append(numpy_helper.from_array(array, fresh))
                node.input[slot] = fresh
        moved.append(_movement(record.name, record.running_mean, record.running_var, mean, var, record.eps))
    method = ("a copy with every BatchNormalization in training_mode=1 exposing its input, run in onnxruntime (graph as written); "
              f"average over batches of batch mean and {variance_estimator} batch variance written into the mean/var initializers")
    return new, moved, method


def save_recalibrated(model: Any, path) -> None:
    """Write a recalibrated .onnx, .pt2 or .keras model atomically."""
    import io
    from pathlib import Path

    from schemas.atomic_io import atomic_write_bytes

    path = Path(path)
    framework = framework_of_model(model)
    if framework == "onnx":
        from converters.onnx_adapter.files import save_onnx

        save_onnx(model, path)
        return
    import torch

    if isinstance(model, torch.export.ExportedProgram):
        buffer = io.BytesIO()
        torch.export.save(model, buffer)
        atomic_write_bytes(path, buffer.getvalue())
        return
    if framework == "keras":
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            temporary = Path(folder) / path.name
            model.save(temporary)
            atomic_write_bytes(path, temporary.read_bytes())
        return
    raise UnsupportedObjectError(f"cannot write a recalibrated {type(model).__name__} to '{path}'; recalibrate a .pt2, .keras or .onnx model.")


__all__ = ["cumulative_statistics", "recalibrate", "save_recalibrated"]
