"""A Keras layer's writes and calls traced once and run for every state it is given (check_many's Keras leg).

Why: check_many (converters/gate/grouped_check.py) gives one Keras layer per configuration each member's state in turn
(`KerasKindAdapter.restate`) and runs it. Eagerly, every call of a layer on a probe of a few thousand numbers spends 1-3
ms in Python (Keras's `__call__`, one TensorFlow dispatch per op), and every variable write a few hundred microseconds;
traced into tf.functions, as Keras's own predict and fit run layers, they cost a fraction, and the trace is paid once
per configuration. Grappler is off for these calls and the kernels run in the calling thread one after another
(thread-local call options, `keras_internals.plain_graphs`): the graph then runs the kernels the eager calls run, on the
same inputs and states, so the written variables, outputs and moved statistics are the eager ones bit for bit
(tests/converters/test_traced_calls.py). With grappler on, the LayerNormalization and RMSNormalization outputs of 8
cases of the table differ from the eager ones in the last bits (it rewrites their arithmetic), and check_many would no
longer give `check`'s results.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from schemas import NormbridgeError, NotExpressibleError, SpecError
from schemas.tensors import tensors_identical

from .. import markers
from .keras_internals import called_flat, plain_graphs
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
    """`write`, `run_eval` and `run_train_step` of one built Keras layer (and the last two in one call),
    each traced on first use.

    Each does what its eager counterpart does (variables.write_variable over every weight, KerasFramework.run_eval and
    run_train_step in place), with the same checks before it runs and the same values after. (Reading the variables
    back traced saves nothing: four eager reads cost what one traced call does.)
    """

    def __init__(self, layer: Any):
        import tensorflow as tf

        self.layer = layer
        self._weights = weights = list(layer.weights)  # a built layer's variables: the same objects for its life
        self._expected = [(tuple(variable.shape), str(variable.dtype)) for variable in weights]
        moving = [getattr(layer, name, None) for name in ("moving_mean", "moving_variance")]

        def write(values):
            for variable, value in zip(weights, values):
                variable.assign(value)
            return [variable.value.read_value() for variable in weights]

        def train(x):
            y = layer(x, training=True)
            return y, [None if variable is None else variable.value.read_value() for variable in moving]

        def evaluate(x):
            return layer(x, training=False)

        def write_and_run(inputs):
            values, x = inputs[:-1], inputs[-1]
            read, out, step = write(values), evaluate(x), train(x)
            for variable, value in zip(weights, values):
                variable.assign(value)  # the state written, as a plain write leaves it
            return read, out, step

        self._tf = tf
        # "both": the eval output, then the step; the function's reads and writes of a variable run in program order
        # (TensorFlow's automatic control dependencies), so the eval output is computed from the statistics before the
        # step moves them.
        self._functions = {
            name: tf.function(function, autograph=False)
            for name, function in (
                ("write", write),
                ("eval", evaluate),
                ("train", train),
                ("both", lambda x: (evaluate(x), train(x))),
                ("write+both", write_and_run),
            )
        }
        self._traced: dict[tuple, Any] = {}  # (function, its inputs' dtypes and shapes) -> the concrete function
        self._next_input: np.ndarray | None = None  # run_with_next_write
        self._ran: tuple[bytes, Any] | None = (
            None  # (the input, what run_eval_and_train_step gives on it) from the last write
        )

    def _call(self, name: str, inputs: Any) -> Any:
        """The function `name` traced for these inputs' dtypes and shapes (once), called on them without grappler."""
        tf = self._tf
        tensors = (
            [tf.constant(value) for value in inputs] if isinstance(inputs, list) else tf.constant(inputs)
        )  # as they are
        flat = tensors if isinstance(tensors, list) else [tensors]
        key = (name, *((t.dtype, tuple(t.shape)) for t in flat))
        concrete = self._traced.get(key)
        if concrete is None:
            concrete = self._traced[key] = self._functions[name].get_concrete_function(tensors)
        with plain_graphs():  # keras_internals: what the eager calls run, bit for bit
            return called_flat(concrete, tensors, flat)

    def run_with_next_write(self, x: np.ndarray | None) -> None:
        """Let the next `write` also run the eval and the training step on `x` from the state it writes, in the same
        call, and put that state back (check_many knows its probe before the write, and the check asks for both after
        it: one dispatch per member instead of two). run_eval_and_train_step(x) then hands them over,
        unless another call came between."""
        self._next_input = None if x is None else np.array(x, copy=True)

    def write(self, values: Sequence[np.ndarray]) -> None:
        """Assign `values` to the layer's weights, in order, and verify each reads back bit-identically."""
        x, self._next_input, self._ran = self._next_input, None, None
        values = [np.asarray(value) for value in values]
        if [(value.shape, _dtype_name(value.dtype)) for value in values] != self._expected:
            raise SpecError(
                f"values {[f'{v.dtype}{list(v.shape)}' for v in values]} for the Keras layer's variables, expected "
                f"{[f'{dtype}{list(shape)}' for shape, dtype in self._expected]}.",
                layer=self.layer.name,
            )
        x = None if x is None else self._runnable(x)
        if x is None:
            read = self._call("write", values)
        else:
            read, out, step = self._call("write+both", [*values, x])
        for variable, value, back in zip(self._weights, values, read):
            if not tensors_identical(back.numpy(), value):
                raise SpecError(
                    f"Keras variable '{variable.path}' did not read back bit-identical after assignment.",
                    layer=self.layer.name,
                )
        if x is not None:
            self._ran = (_key(x), (np.asarray(out.numpy()), _step(step)))

    def _runnable(self, x: np.ndarray) -> np.ndarray | None:
        """`x` as the runs take it, or None where run_eval_and_train_step would refuse before running
        (it then refuses itself)."""
        try:
            built_input_shape(self.layer)
            refuse_instance_training(self.layer)
        except NormbridgeError:
            return None
        return np.asarray(x).astype(self.layer.compute_dtype, copy=False)

    def run_eval(self, x: np.ndarray) -> np.ndarray:
        """KerasFramework.run_eval(layer, x, in_place=True)."""
        self._ran = None
        built_input_shape(self.layer)
        return np.asarray(self._call("eval", np.asarray(x).astype(self.layer.compute_dtype, copy=False)).numpy())

    def run_train_step(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """KerasFramework.run_train_step(layer, x, in_place=True)."""
        layer, self._ran = self.layer, None
        refuse_instance_training(layer)
        return _step(self._call("train", np.asarray(x).astype(layer.compute_dtype, copy=False)))

    def run_eval_and_train_step(
        self, x: np.ndarray
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]:
        """(run_eval(x), then run_train_step(x)) in one call, for a check that asks for both on one state: one dispatch
        instead of two; none when the last write ran them on this input (run_with_next_write). Refuses what either
        refuses, before anything runs."""
        layer, ran, self._ran = self.layer, self._ran, None
        built_input_shape(layer)
        refuse_instance_training(layer)
        x = np.asarray(x).astype(layer.compute_dtype, copy=False)
        if ran is not None and ran[0] == _key(x):
            return ran[1]
        out, step = self._call("both", x)
        return np.asarray(out.numpy()), _step(step)


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: np.dtype) -> str:
    """str(dtype), remembered (NumPy computes a dtype's name in Python on every call; every write names each
    value's)."""
    return str(dtype)


def _key(x: np.ndarray) -> tuple:
    return x.dtype.str, x.shape, x.tobytes()


def _step(values: Any) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The training function's (output, [moving mean, moving variance]) as run_train_step returns them."""
    y, (mean, var) = values
    return (
        np.asarray(y.numpy()),
        None if mean is None else np.array(mean.numpy(), copy=True),
        None if var is None else np.array(var.numpy(), copy=True),
    )


def refuse_instance_training(layer: Any) -> None:
    """NotExpressibleError for a plain BatchNormalization an older normbridge emitted for a tracked InstanceNorm: its
    training step is not the source's (KerasFramework.run_train_step and TracedCalls.run_train_step both refuse it). The
    TrackedInstanceNormalization emitted now takes the source's step."""
    from .tracked_instance_normalization import TrackedInstanceNormalization

    if (
        markers.recall(layer).get("kind") == "instance"
        and isinstance(layer, import_keras().layers.BatchNormalization)
        and not isinstance(layer, TrackedInstanceNormalization)
    ):
        raise NotExpressibleError(
            "this BatchNormalization holds a tracked InstanceNorm's running statistics for eval; its training step pools the batch "
            "instead of normalising per instance; train the source layer instead.",
            layer=layer.name,
            setting="track_running_stats",
            target="keras",
        )
