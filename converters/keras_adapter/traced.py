"""A Keras layer's writes and calls traced once and run for every state it is given (check_many's Keras leg).

Why: check_many (converters/grouped_check.py) gives one Keras layer per configuration each member's state in turn
(`KerasKindAdapter.restate`) and runs it. Eagerly, every call of a layer on a probe of a few thousand numbers spends
1-3 ms in Python (Keras's `__call__`, one TensorFlow dispatch per op), and every variable write a few hundred
microseconds; traced into tf.functions, as Keras's own predict and fit run layers, they cost a fraction, and the trace is
paid once per configuration. Grappler is off for these calls (a thread-local call option, `_plain_graphs`): the graph
then runs the kernels the eager calls run, on the same inputs and states, so the written variables, outputs and moved
statistics are the eager ones bit for bit (tests/converters/test_traced_calls.py); left on, TensorFlow may rewrite the
arithmetic (fuse a layer norm's ops, reorder a chain of products) and change the last bits, and `check_many` would
then no longer give `check`'s results.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from schemas import NotExpressibleError, SpecError
from schemas.tensors import tensors_identical

from .. import markers
from .runtime import import_keras
from .shapes import built_input_shape

#: Where a layer keeps its TracedCalls (set with object.__setattr__: Keras tracks no such attribute).
TRACED = "_normbridge_traced_calls"


def kept_calls(layer: Any) -> "TracedCalls | None":
    """The layer's TracedCalls if it has been given them (it is then written traced as well), else None."""
    return getattr(layer, TRACED, None)


def traced_calls(layer: Any) -> "TracedCalls":
    """The layer's TracedCalls, made on first use and kept with the layer."""
    calls = getattr(layer, TRACED, None)
    if calls is None:
        calls = TracedCalls(layer)
        object.__setattr__(layer, TRACED, calls)
    return calls


class TracedCalls:
    """`write`, `run_eval` and `run_train_step` of one built Keras layer, each traced on first use.

    Each does what its eager counterpart does (variables.write_variable over every weight; KerasFramework.run_eval and
    run_train_step in place), with the same checks before it runs and the same values after.
    """

    def __init__(self, layer: Any):
        import tensorflow as tf

        self.layer = layer
        weights = list(layer.weights)
        moving = [getattr(layer, name, None) for name in ("moving_mean", "moving_variance")]

        def write(values):
            for variable, value in zip(weights, values):
                variable.assign(value)
            return [variable.value.read_value() for variable in weights]

        def train(x):
            y = layer(x, training=True)
            return y, [None if variable is None else variable.value.read_value() for variable in moving]

        self._tf = tf
        self._functions = {"write": tf.function(write, autograph=False), "eval": tf.function(lambda x: layer(x, training=False), autograph=False),
                           "train": tf.function(train, autograph=False)}
        self._traced: dict[tuple, Any] = {}  # (function, its inputs' dtypes and shapes) -> the concrete function

    def _call(self, name: str, inputs: Any) -> Any:
        """The function `name` traced for these inputs' dtypes and shapes (once), called on them without grappler."""
        tensors = self._tf.nest.map_structure(self._tf.convert_to_tensor, inputs)
        key = (name, *((t.dtype, tuple(t.shape)) for t in self._tf.nest.flatten(tensors)))
        concrete = self._traced.get(key)
        if concrete is None:
            concrete = self._traced[key] = self._functions[name].get_concrete_function(tensors)
        with _plain_graphs():
            return concrete(tensors)

    def write(self, values: Sequence[np.ndarray]) -> None:
        """Assign `values` to the layer's weights, in order, and verify each reads back bit-identically."""
        weights = self.layer.weights
        if len(values) != len(weights):
            raise SpecError(f"{len(values)} values for the {len(weights)} variables of the Keras layer.", layer=self.layer.name)
        for variable, value in zip(weights, values):
            if tuple(variable.shape) != tuple(value.shape) or str(variable.dtype) != str(value.dtype):
                raise SpecError(f"a {value.dtype}{list(value.shape)} value for Keras variable '{variable.path}', expected "
                                f"{variable.dtype}{list(variable.shape)}.", layer=self.layer.name)
        read = self._call("write", [np.asarray(value) for value in values])
        for variable, value, back in zip(weights, values, read):
            if not tensors_identical(back.numpy(), np.asarray(value)):
                raise SpecError(f"Keras variable '{variable.path}' did not read back bit-identical after assignment.", layer=self.layer.name)

    def run_eval(self, x: np.ndarray) -> np.ndarray:
        """KerasFramework.run_eval(layer, x, in_place=True)."""
        built_input_shape(self.layer)
        return np.asarray(self._call("eval", np.asarray(x).astype(self.layer.compute_dtype, copy=False)).numpy())

    def run_train_step(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """KerasFramework.run_train_step(layer, x, in_place=True)."""
        layer = self.layer
        if markers.recall(layer).get("kind") == "instance" and isinstance(layer, import_keras().layers.BatchNormalization):
            raise NotExpressibleError(
                "this BatchNormalization holds a tracked InstanceNorm's running statistics for eval; its training step pools the batch "
                "instead of normalising per instance; train the source layer instead.", layer=layer.name, setting="track_running_stats", target="keras")
        y, (mean, var) = self._call("train", np.asarray(x).astype(layer.compute_dtype, copy=False))
        return np.asarray(y.numpy()), None if mean is None else np.array(mean.numpy(), copy=True), None if var is None else np.array(var.numpy(), copy=True)


_PLAIN: dict[bytes, Any] = {}  # the caller's serialized call config -> the same with grappler off


@contextlib.contextmanager
def _plain_graphs() -> Iterator[None]:
    """Run tf.functions called in this block, in this thread, without grappler's rewrites."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    current = ctx.function_call_options
    key = current.config_proto_serialized
    plain = _PLAIN.get(key)
    if plain is None:
        config = config_pb2.ConfigProto()
        config.ParseFromString(key)
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        plain = _PLAIN.setdefault(key, type(current)(current.executor_type, config))
    ctx.function_call_options = plain
    try:
        yield
    finally:
        ctx.function_call_options = current
