"""Exporting a Keras model to ONNX for serving (tf2onnx, traced by normbridge), and what TF folded on the way.

tf2onnx writes at most the opset it supports; the rewrite raises the opset only where a native
op needs it. TF's grappler folds each BatchNorm that follows a convolution into the Conv
kernel: `conv_batchnorms` lists those pairs with the kernel in ONNX Conv layout, so that
`onnx_adapter.graph.unfold` can put the BatchNorm back.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from schemas import InputFileError, NormSpec, UnsupportedObjectError

from . import tf2onnx_export
from .inputs import pack_inputs
from .keras_internals import all_layers, producing_layer
from .runtime import import_keras


def _tf2onnx_max_opset() -> int:
    import tf2onnx.constants

    return max(tf2onnx.constants.OPSET_TO_IR_VERSION)


def _call_once(model, sample) -> None:
    """Keras exports only a model that has been called."""
    model(pack_inputs(model, list(sample.rows(slice(0, 1)))), training=False)


def _opset(opset: int) -> tuple[int, list[str]]:
    import tf2onnx

    used = min(opset, _tf2onnx_max_opset())
    if used < opset:
        return used, [
            f"tf2onnx {tf2onnx.__version__} writes at most opset {used}; the rewrite raises the opset only where a native op needs it"
        ]
    return used, []


def export_onnx(model, sample, opset: int) -> tuple[Any, str, list[str]]:
    """(onnx.ModelProto, the exporter as named in reports, notes) through normbridge's own tf2onnx call
    (tf2onnx_export.py)."""
    import tf2onnx

    used, notes = _opset(opset)
    _call_once(model, sample)
    exported = tf2onnx_export.export_model(model, used)
    return (
        exported,
        f"tf2onnx {tf2onnx.__version__} (traced by normbridge: captured constants kept, Erfc as 1 - Erf) at opset {used}",
        notes,
    )


def export_with_keras(model, sample, opset: int) -> tuple[Any, str, list[str]]:
    """The same through keras.Model.export(format='onnx'), the path normbridge used before
    (kept for bench/models.py)."""
    import tf2onnx

    from ..onnx_adapter.files import load_onnx

    used, notes = _opset(opset)
    _call_once(model, sample)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"

        def told(error: Exception) -> str:  # the message without normbridge's temporary file, which the user never made
            message = (
                str(error)
                .strip()
                .replace(f"'{path}' ", "")
                .replace(str(path), "the exported file")
                .replace(folder, "a temporary folder")
            )
            return message.splitlines()[0][:300] if message else type(error).__name__

        try:
            model.export(str(path), format="onnx", opset_version=used, verbose=False)
        except Exception as error:
            raise UnsupportedObjectError(
                f"Keras's ONNX export failed ({type(error).__name__}: {told(error)})."
            ) from error
        try:
            loaded = load_onnx(path)
        except InputFileError as error:
            detail = told(error).removeprefix("is not a valid ONNX model").split(";")[0].strip()
            raise UnsupportedObjectError(
                f"Keras's ONNX export wrote an invalid ONNX file {detail}; normbridge's own export (export_onnx) traces the model itself."
            ) from error
        return loaded, f"keras.Model.export(format='onnx') via tf2onnx {tf2onnx.__version__} at opset {used}", notes


def _onnx_kernel(layer) -> np.ndarray | None:
    """A Keras convolution's kernel in ONNX Conv layout (out, in/groups, *window), or None for other layers.

    A separable convolution is two ONNX Convs, depthwise then pointwise; TF folds a following BatchNorm into the
    second, so its kernel here is the pointwise one (Xception's 34 BatchNorms after SeparableConv2D: issue 34)."""
    keras = import_keras()
    name = type(layer).__name__
    if name in ("SeparableConv1D", "SeparableConv2D"):
        kernel = getattr(layer, "pointwise_kernel", None)
        if kernel is None:
            return None
        kernel = keras.ops.convert_to_numpy(kernel)
        return np.ascontiguousarray(np.transpose(kernel, (kernel.ndim - 1, kernel.ndim - 2, *range(kernel.ndim - 2))))
    if (
        name not in ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv1D", "DepthwiseConv2D")
        or getattr(layer, "kernel", None) is None
    ):
        return None
    kernel = keras.ops.convert_to_numpy(layer.kernel)
    n = kernel.ndim - 2
    if name.startswith("Depthwise"):  # (*window, C, multiplier) -> (C * multiplier, 1, *window), channel-major like TF
        merged = kernel.reshape(kernel.shape[:n] + (-1,))
        return np.ascontiguousarray(np.transpose(merged, (n, *range(n)))[:, None])
    return np.ascontiguousarray(np.transpose(kernel, (n + 1, n, *range(n))))


def conv_batchnorms(keras_model, specs: list[NormSpec]) -> list:
    """Each eval BatchNorm fed directly by a convolution, with the kernel in ONNX layout
    (graph.unfold.ConvBatchNorm)."""
    from ..onnx_adapter.graph.unfold import ConvBatchNorm

    keras = import_keras()
    by_name = {s.name: s for s in specs if s.kind == "batch" and s.track_running_stats and not s.training}
    pairs = []
    layers = all_layers(keras_model)
    for layer in layers:
        if not isinstance(layer, keras.layers.BatchNormalization) or layer.name not in by_name:
            continue
        try:
            producer = producing_layer(layer.input, layers)
        except (AttributeError, ValueError, IndexError):
            continue
        if producer is None:
            continue
        kernel = _onnx_kernel(producer)
        if kernel is None:
            continue
        bias = (
            keras.ops.convert_to_numpy(producer.bias)
            if getattr(producer, "use_bias", False) and getattr(producer, "bias", None) is not None
            else None
        )
        pairs.append(ConvBatchNorm(layer.name, kernel, bias, by_name[layer.name]))
    return pairs
