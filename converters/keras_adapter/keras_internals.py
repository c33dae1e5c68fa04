"""Every use of Keras's and TensorFlow's private modules and attributes, one function each,
so a release that renames one fails here, by name.

Each function's docstring says what it reaches and what replaces it when it fails: a public Keras path where one gives
the same answer (the layers of a model, its input structure, the layer that made a tensor), the eager or unpatched path
where the private one only saves time (TensorFlow's flat call, Keras's plain convolution), and MissingDependencyError
naming the Keras version where nothing does (the variables a `.keras` config builds, counted before they are allocated).
None answers "nothing" for a model that has something: `all_layers` raises rather than return no layers, which would
hide every layer from the unrecognised-normalization hazard. tests/converters/test_keras_internals.py runs every access
on the installed Keras and each fallback against the private path.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from schemas import UnsupportedObjectError
from schemas.errors import MissingDependencyError

from .runtime import import_keras

_LOG = logging.getLogger(__name__)


def keras_version() -> str:
    return str(import_keras().__version__)


def fell_back(step: str, error: BaseException) -> None:
    """The one debug line logged when `step` takes the public (or eager) path."""
    if _LOG.isEnabledFor(logging.DEBUG):
        _LOG.debug(
            "%s: Keras %s's public path taken (%s: %s)", step, keras_version(), type(error).__name__, _first_line(error)
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else ""


def _unavailable(what: str, purpose: str, error: BaseException) -> MissingDependencyError:
    return MissingDependencyError(
        f"Keras {keras_version()} has no {what} ({type(error).__name__}), which normbridge needs {purpose}; install a Keras in the "
        "range normbridge's pyproject.toml admits (pip install 'normbridge[keras]').",
        setting="keras",
    )


# -- the layers of a model ---------------------------------------------------------------------------------------------


def all_layers(model: Any) -> list:
    """Every layer inside `model`, nested ones included, itself excluded: Keras's
    `model._flatten_layers(include_self=False, recursive=True)`, or on failure the same walk over public attributes
    (`public_layers`).

    Raises:
        UnsupportedObjectError: neither walk finds a layer in a model whose public `layers` lists some (nothing would be
            listed, converted or checked, and no layer would be reported as an unrecognised normalization).
    """
    try:
        found = list(model._flatten_layers(include_self=False, recursive=True))  # noqa: SLF001
    except Exception as error:
        fell_back("the layers of a model", error)
        found = None
    if not found:
        try:
            found = public_layers(model)
        except Exception as error:
            raise UnsupportedObjectError(
                f"the layers of Keras model '{getattr(model, 'name', model)}' cannot be listed in Keras {keras_version()} "
                f"({type(error).__name__}: {_first_line(error)}); install a Keras in the range normbridge's pyproject.toml admits "
                "(pip install 'normbridge[keras]')."
            ) from error
    if not found and _listed_layers(model):
        raise UnsupportedObjectError(
            f"Keras model '{getattr(model, 'name', model)}' lists {len(_listed_layers(model))} layers in `layers`, but neither Keras "
            f"{keras_version()}'s own walk nor normbridge's found any inside it; nothing in it could be checked: install a Keras in "
            "the range normbridge's pyproject.toml admits (pip install 'normbridge[keras]')."
        )
    return found


def public_layers(model: Any) -> list:
    """`_flatten_layers`' walk (each layer once, a nested layer's sublayers visited before its next sibling's, last
    first, as Keras's deque does) over the public ways sublayers are held: a Model's `layers`, and the attributes (or
    lists, tuples and dict values of them) a layer tracks sublayers by."""
    found, seen = [], set()
    pending = _public_sublayers(model)
    while pending:
        layer = pending.pop(0)
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        found.append(layer)
        pending[:0] = reversed(_public_sublayers(layer))  # deque.extendleft: the last sublayer first
    return found


def sublayers(layer: Any) -> list:
    """The layers `layer` holds directly: Keras's `layer._layers`, or on failure the public ones
    (`_public_sublayers`)."""
    try:
        held = layer._layers  # noqa: SLF001
        if isinstance(held, (list, tuple)):
            return list(held)
        raise TypeError(f"_layers is a {type(held).__name__}")
    except Exception as error:
        fell_back("the sublayers of a layer", error)
        return _public_sublayers(layer)


def _public_sublayers(layer: Any) -> list:
    keras = import_keras()
    if isinstance(layer, keras.Sequential):
        return list(layer.layers)
    if isinstance(layer, keras.Model) and _is_functional(layer):
        return list(layer.layers)
    found: list = []
    for value in vars(layer).values():
        for item in (
            value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
        ):
            if isinstance(item, keras.layers.Layer) and item is not layer and all(item is not f for f in found):
                found.append(item)
    return found


def _is_functional(model: Any) -> bool:
    try:
        return bool(model.inputs) and bool(model.outputs)
    except Exception:
        return False


def _listed_layers(model: Any) -> list:
    try:
        return list(getattr(model, "layers", None) or [])
    except Exception:
        return []


def has_sublayers(layer: Any) -> bool:
    """Whether `layer` holds layers of its own (`sublayers`)."""
    return bool(sublayers(layer))


# -- inputs, tensors, variables ----------------------------------------------------------------------------------------


def inputs_structure(model: Any) -> Any:
    """The structure a functional model was built on (a tensor, list or dict): Keras's `model._inputs_struct`, or on
    failure the public `model.input`, which a functional model answers with that structure;
    None for a model that has neither."""
    try:
        return model._inputs_struct  # noqa: SLF001
    except AttributeError as error:
        fell_back("a model's input structure", error)
    try:
        return model.input
    except Exception:  # a subclassed or unbuilt model: no structure recorded
        return None


def autocasts(variable: Any) -> bool:
    """Whether `variable` was created with autocast=True: Keras's `variable._autocast`; True (Keras's default) when it
    does not say (keras_adapter.variables then refuses a layer whose variables disagree)."""
    return bool(getattr(variable, "_autocast", True))


def producing_layer(tensor: Any, layers: list) -> Any:
    """The layer whose call made the symbolic `tensor`: Keras's `tensor._keras_history[0]`, or on failure the layer
    among `layers` whose public `output` is `tensor`; None when none is."""
    try:
        return tensor._keras_history[0]  # noqa: SLF001
    except Exception as error:
        fell_back("the layer that made a tensor", error)
    for layer in layers:
        try:
            if layer.output is tensor:
                return layer
        except Exception:  # a layer called more than once, or never
            continue
    return None


# -- counting the variables a .keras config builds (keras_adapter.built_variables) -------------------------------------


def _global_state() -> Any:
    try:
        from keras.src.backend.common import global_state
    except ImportError as error:
        raise _unavailable(
            "'keras.src.backend.common.global_state'",
            "to count a .keras file's variables before Keras allocates them",
            error,
        ) from error
    return global_state


def uninitialized_variables() -> Any:
    """`keras.src.backend.common.global_state.get_global_attribute("uninitialized_variables")`, Keras's own
    (thread-local) list of the variables created uninitialised in a stateless scope;
    nothing replaces it: MissingDependencyError."""
    return _global_state().get_global_attribute("uninitialized_variables")


def set_uninitialized_variables(value: Any) -> None:
    """`global_state.set_global_attribute("uninitialized_variables", value)`;
    nothing replaces it: MissingDependencyError."""
    _global_state().set_global_attribute("uninitialized_variables", value)


def object_sharing_scope() -> Any:
    """`keras.src.saving.serialization_lib.ObjectSharingScope()`, what keras.saving.load_model deserialises under
    (shared objects built once); nothing replaces it (counting without it would not count what loading builds):
    MissingDependencyError."""
    try:
        from keras.src.saving.serialization_lib import ObjectSharingScope
    except ImportError as error:
        raise _unavailable(
            "'keras.src.saving.serialization_lib.ObjectSharingScope'",
            "to count a .keras file's variables as Keras's loader builds them",
            error,
        ) from error
    return ObjectSharingScope()


# -- TensorFlow: tracing for ONNX export and the traced layer calls ----------------------------------------------------


@contextlib.contextmanager
def plain_convolutions(lock: Any) -> Iterator[None]:
    """Keras's TensorFlow `conv` (`keras.src.backend.tensorflow.nn.conv`) as a plain `tf.nn.convolution`, without the
    XLA wrapper it puts around grouped convolutions (which tf2onnx cannot convert), for the duration of one trace under
    `lock`; on failure to reach it, Keras's own conv is traced."""
    import tensorflow as tf

    try:
        from keras.src.backend import standardize_data_format
        from keras.src.backend.tensorflow import nn as keras_tf_nn

        convert_data_format = keras_tf_nn._convert_data_format  # noqa: SLF001
        keras_tf_nn.conv  # noqa: B018  the function replaced
    except Exception as error:
        fell_back("the plain convolutions of a trace", error)
        yield
        return

    def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
        tf_format = convert_data_format(standardize_data_format(data_format), len(inputs.shape))
        return tf.nn.convolution(
            inputs, kernel, strides, padding.upper(), data_format=tf_format, dilations=dilation_rate
        )

    with lock:
        original = keras_tf_nn.conv
        keras_tf_nn.conv = conv
        try:
            yield
        finally:
            keras_tf_nn.conv = original


def called_flat(concrete: Any, tensors: Any, flat: list) -> Any:
    """`concrete(tensors)`, through the call its __call__ ends in when no tape records and nothing is being traced
    (TensorFlow's `tensorflow.python.eager.record.could_possibly_record`, `context.executing_eagerly` and
    `concrete._inference_function.call_preflattened`): the inputs, matching the trace by construction, are passed flat
    with the captured variables, which skips binding them to the signature;
    on failure to reach those, `concrete(tensors)`."""
    try:
        from tensorflow.python.eager import context, record

        direct = not record.could_possibly_record() and context.executing_eagerly()
        call = concrete._inference_function.call_preflattened  # noqa: SLF001
    except Exception as error:
        fell_back("a traced function's flat call", error)
        return concrete(tensors)
    if not direct:
        return concrete(tensors)  # the function's own call, which records the gradients or builds the call op
    return call(flat + concrete.captured_inputs)


_PLAIN: dict[bytes, Any] = {}  # the caller's serialized call config -> the same with grappler off


@functools.cache
def plain_graphs_available() -> bool:
    """Whether `plain_graphs` can run here (TensorFlow's
    `tensorflow.python.eager.context.context().function_call_options`); when it cannot, Keras layers are run eagerly,
    never traced with grappler's rewrites (which change the last bits)."""
    try:
        from tensorflow.core.protobuf import config_pb2  # noqa: F401
        from tensorflow.python.eager import context

        options = context.context().function_call_options
        options.config_proto_serialized  # noqa: B018
        return True
    except Exception as error:
        fell_back("the plain graph options of traced layer calls", error)
        return False


@contextlib.contextmanager
def plain_graphs() -> Iterator[None]:
    """Run tf.functions called in this block, in this thread, without grappler's rewrites and each kernel in the calling
    thread, one after another, as eager ops run (TensorFlow's thread-local `function_call_options` set to the
    single-threaded executor); only called where `plain_graphs_available()`, else Keras layers run eagerly."""
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
        plain = _PLAIN.setdefault(key, type(current)("SINGLE_THREADED_EXECUTOR", config))
    ctx.function_call_options = plain
    try:
        yield
    finally:
        ctx.function_call_options = current


# -- tf2onnx: the conversion of a traced Keras model -------------------------------------------------------------------


def converted_with_optimizers(
    frozen: Any, optimizers: Callable[[dict], dict], public: Callable[[], Any], **options: Any
) -> Any:
    """tf2onnx's conversion of a frozen graph with its default optimizers passed through `optimizers` (tf2onnx's
    `tf2onnx.optimizer._get_optimizers()` and `tf2onnx.convert._convert_common`, the steps
    `tf2onnx.convert.from_function` takes, which accepts no optimizers); on failure to reach or call those, `public()`:
    `from_function`'s own path, the same graph with tf2onnx's own optimizer loop
    (more memory at its peak on large models: see tf2onnx_export)."""
    try:
        from tf2onnx import convert, optimizer

        default = optimizer._get_optimizers()  # noqa: SLF001
        convert_common = convert._convert_common  # noqa: SLF001
        chosen = optimizers(default)
    except Exception as error:
        fell_back("tf2onnx's conversion with normbridge's optimizer loop", error)
        return public()
    try:
        model_proto, _ = convert_common(frozen, optimizers=chosen, **options)
    except TypeError as error:  # a tf2onnx whose _convert_common takes other arguments
        fell_back("tf2onnx's conversion with normbridge's optimizer loop", error)
        return public()
    return model_proto


def transposes_kept(factory: Any) -> Any:
    """tf2onnx's TransposeOptimizer (the class `factory`) without its last step (`post_optimize_action`, not part of
    tf2onnx's documented API), which rewrites each Transpose that moves only size-1 axes as a Reshape to the shape
    tf2onnx recorded; the records go stale where the optimizer moved a Transpose through a broadcasting op, so at 1x1
    spatial (ConvNeXt's last stage at 32x32) the Reshape reorders channels wrongly ((N, C, 1, 1) as (N, 1, C, 1)) and a
    LayerNorm normalizes each element alone (issue 34). A Transpose is right at any shape. A tf2onnx whose optimizer has
    no such step gets its own class back: nothing to take out."""
    if not isinstance(factory, type) or not callable(getattr(factory, "post_optimize_action", None)):
        return factory

    class TransposesKept(factory):
        def post_optimize_action(self):
            return None

    return TransposesKept


@contextlib.contextmanager
def transposes_kept_in_tf2onnx() -> Iterator[None]:
    """`transposes_kept` for tf2onnx's own optimizer loop (`from_function`, which takes no optimizers): its
    TransposeOptimizer's last step is a no-op while the block runs (callers hold the trace lock, as every trace does); a
    tf2onnx without that class or step runs unchanged."""
    try:
        from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer
    except ImportError as error:
        fell_back("tf2onnx's transpose optimizer without its size-1 Reshapes", error)
        yield
        return
    step = TransposeOptimizer.__dict__.get("post_optimize_action")
    if step is None:
        yield
        return
    TransposeOptimizer.post_optimize_action = lambda self: None
    try:
        yield
    finally:
        TransposeOptimizer.post_optimize_action = step


__all__ = [
    "all_layers",
    "autocasts",
    "called_flat",
    "converted_with_optimizers",
    "has_sublayers",
    "inputs_structure",
    "object_sharing_scope",
    "plain_convolutions",
    "plain_graphs",
    "plain_graphs_available",
    "producing_layer",
    "public_layers",
    "set_uninitialized_variables",
    "sublayers",
    "transposes_kept",
    "transposes_kept_in_tf2onnx",
    "uninitialized_variables",
]
