"""Keras -> ONNX through tf2onnx, called by normbridge directly rather than through `keras.Model.export(format="onnx")`.

`model.export` (keras/src/export/onnx.py) traces `model.call` and hands it to
`tf2onnx.convert.from_function`; on real models that file is incomplete or wrong in three ways,
each fixed here, in memory (no temporary file):

- tensors the trace captures by value (keras.layers.Normalization keeps its statistics as eager
  tensors made by `finalize_state`) become extra graph *inputs*: the served model then asks the
  caller for the training data's mean and variance (EfficientNetB0, ConvNeXtTiny). Here they are
  initializers holding the captured values, bit for bit.
- tf2onnx has no `Erfc`, which TF's exact GELU uses (ConvNeXt): written here as `1 - Erf(x)`.
- Keras wraps a grouped convolution (ConvNeXt's depthwise Conv2D with groups=channels) in a
  nested `tf.function(jit_compile=True)` (keras/src/backend/tensorflow/nn.py: grouped convolutions
  fail on CPU without XLA), which TF's freezing keeps as a `StatefulPartitionedCall` tf2onnx cannot
  convert. While tracing for export, Keras's TF `conv` is swapped for the plain
  `tf.nn.convolution` (what tf2onnx turns into an ONNX Conv with `group`); only the trace sees it.
- a model with nested inputs (keras_hub's dict of token_ids and padding_mask) is traced with its
  own structure; the ONNX inputs come in `model.inputs` order, the order normbridge feeds them.
- tf2onnx's optimizer loop deep-copies the whole graph, weights included, before each of its ~12
  optimizers, every round; the copy it replaces is a reference cycle, freed only by a full garbage
  collection, which a process holding TensorFlow's objects runs rarely: ConvNeXtTiny's copies (~320 MB
  each) took a test process to 12.8 GB (issue 31). Here each optimizer first collects the copy the
  previous one left (`_collecting_optimizers`), so one copy is alive at a time; the graph is the same.
- tf2onnx's transpose optimizer ends by turning each Transpose of size-1 axes into a Reshape to the shape it recorded,
  records its own moves leave stale: at 1x1 spatial the file computed a wrong answer (Keras ConvNeXtTiny at 32x32 served
  [N, 1, 768, 768] for [N, 1, 1, 768]; issue 34). Here those Transposes stay (keras_internals.transposes_kept, and
  transposes_kept_in_tf2onnx on the public path).
"""

from __future__ import annotations

import gc
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from schemas import UnsupportedObjectError

from ..heap import collections_of_the_block_only
from ..model_values import first_line
from .inputs import pack_inputs
from .keras_internals import converted_with_optimizers, plain_convolutions, transposes_kept, transposes_kept_in_tf2onnx
from .runtime import import_keras


def _erfc(ctx, node, name, args) -> None:
    """tf2onnx custom handler: Erfc(x) -> Sub(1, Erf(x))."""
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    node.type = "Erf"
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=dtype))
    ctx.insert_new_node_on_output(
        "Sub", node.output[0], name=utils.make_name(f"{name}_erfc"), inputs=[one.output[0], node.output[0]]
    )


CUSTOM_OPS = {"Erfc": (_erfc, [])}
_TRACE_LOCK = threading.Lock()


def _collecting(factory):
    """A tf2onnx optimizer factory that first frees the graph copies earlier optimizers discarded
    (cycles: only gc frees them)."""

    def make():
        gc.collect()
        return factory()

    return make


def _collecting_optimizers(default: dict) -> dict:
    """tf2onnx's default optimizers, in its order, each collecting the garbage of the one before (the transpose
    optimizer keeps its Transposes: keras_internals.transposes_kept)."""
    return OrderedDict(
        (name, _collecting(transposes_kept(factory) if name == "optimize_transpose" else factory))
        for name, factory in default.items()
    )


def _signature(model: Any) -> list:
    import tensorflow as tf

    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError) as error:
        raise UnsupportedObjectError(
            f"Keras model '{model.name}' has no defined inputs ({error}); build it with keras.Input."
        ) from error
    return [tf.TensorSpec(tuple(t.shape), t.dtype, name=f"input_{i}") for i, t in enumerate(inputs)]


def _inline_captures(model_proto, captured: dict[str, np.ndarray]):
    """Graph inputs that are tensors the trace captured, replaced by initializers with their values."""
    from onnx import numpy_helper

    graph = model_proto.graph
    keep = []
    for value in graph.input:
        array = captured.get(value.name, captured.get(value.name.split(":")[0]))
        if array is None:
            keep.append(value)
            continue
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), value.name))
    del graph.input[:]
    graph.input.extend(keep)
    return model_proto


def _convert(serve, signature: list, concrete, opset: int):
    """tf2onnx.convert.from_function's steps on a traced function, with `_collecting_optimizers` (from_function takes no
    optimizers; keras_internals.converted_with_optimizers falls back to it)."""
    import tensorflow as tf
    from tf2onnx import convert, tf_loader

    def public():
        with transposes_kept_in_tf2onnx():
            return convert.from_function(serve, input_signature=signature, opset=opset, custom_op_handlers=CUSTOM_OPS)[
                0
            ]

    input_names = [t.name for t in concrete.inputs if t.dtype != tf.dtypes.resource]
    output_names = [t.name for t in concrete.outputs if t.dtype != tf.dtypes.resource]
    renamed = convert.tensor_names_from_structed(concrete, input_names, output_names)
    with tf.device("/cpu:0"):
        frozen = tf_loader.from_function(concrete, input_names, output_names)
        return converted_with_optimizers(
            frozen,
            _collecting_optimizers,
            public,
            name=concrete.name,
            continue_on_error=True,
            opset=opset,
            custom_op_handlers=CUSTOM_OPS,
            input_names=input_names,
            output_names=output_names,
            tensors_to_rename=renamed,
        )


def export_model(model: Any, opset: int):
    """The ONNX ModelProto of `model` in inference mode (training=False) at `opset`."""
    import tensorflow as tf

    signature = _signature(model)

    @tf.function(autograph=False)
    def serve(*flat):
        return model(pack_inputs(model, list(flat)), training=False)

    import_keras()
    try:
        with plain_convolutions(_TRACE_LOCK):  # Keras's TF conv without its XLA wrapper for grouped convolutions
            concrete = serve.get_concrete_function(*signature)
            with collections_of_the_block_only():  # the optimizers' collections scan the export's objects only
                model_proto = _convert(serve, signature, concrete, opset)
    except Exception as error:
        raise UnsupportedObjectError(
            f"tf2onnx could not convert Keras model '{model.name}' ({type(error).__name__}: {first_line(error)})."
        ) from error
    captured = {}
    for external, internal in concrete.graph.captures:
        if external.dtype != tf.resource:
            value = np.asarray(external.numpy())
            captured[internal.name] = value
            captured[internal.name.split(":")[0]] = value
    return _inline_captures(model_proto, captured)
