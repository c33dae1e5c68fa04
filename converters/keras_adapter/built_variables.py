"""The variables a `.keras` config builds, counted without allocating them.

Keras builds every layer from config.json and initialises its variables before it reads any weight: an 18 KB config
declaring an 8000x8000 Dense cost +0.95 GiB, 24000x24000 +11.8 GiB and 93 s of random initialisation, before the
weights file was opened. The config is deserialised here as Keras's loader does (safe_mode=True, no compile config,
shared objects shared) inside a `keras.StatelessScope(initialize_variables=False)`: a variable created there with an
initializer keeps only its shape and dtype and is registered as uninitialised (Keras's deferred initialisation, made
for building models under JAX tracing), so every variable any layer's `build` creates, tracked or not, is seen with
its size and none is allocated. The model is then dropped and its variables never initialised.

A layer that reads a variable in `build` (Normalization reshapes its mean there) makes Keras run that initializer at
once: such reads are charged against a budget (what the weights file declares) and refused past it, before the
initializer runs. Reads inside Keras's symbolic passes are not allocations on the TensorFlow backend normbridge loads
Keras on (they run in a scratch graph).

Not covered: memory a layer allocates in `__init__` or `build` other than variables (no stock Keras layer does more than
its config holds), and a layer that creates a variable from a value rather than an initializer, which Keras refuses
inside the scope (the file is then refused, naming the error).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import keras_internals
from .runtime import import_keras


@dataclass(frozen=True)
class BuiltVariable:
    path: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)

    def __str__(self) -> str:
        return f"'{self.path}' {self.dtype}{list(self.shape)}"


class VariablesOverBudget(Exception):
    """A layer read uninitialised variables in its `build` (so their initializers would run) past the budget."""

    def __init__(self, variable: BuiltVariable, read: int, budget: int):
        super().__init__(f"{variable} was read while building, {read} bytes read so far against {budget}")
        self.variable, self.read, self.budget = variable, read, budget


def built_variables(config: dict, budget: int) -> list[BuiltVariable]:
    """Every variable that loading `config` (config.json, parsed) would create, none of them allocated.

    A layer that reads its variables in `build` (Normalization does) makes Keras run their initializers then: those
    reads may materialise at most `budget` bytes, else VariablesOverBudget is raised before the initializer runs.

    Raises:
        VariablesOverBudget: as above.
        MissingDependencyError: a Keras without the scope and the list this counts with (keras_internals).
        Whatever Keras raises deserialising the config (safe_mode refusals included): the caller maps it.
    """
    keras = import_keras()
    sharing = keras_internals.object_sharing_scope()  # what keras.saving.load_model deserialises under
    config = {**config, "compile_config": None}  # as load_model(compile=False)
    pending = keras_internals.uninitialized_variables()  # Keras's own (thread-local) list; the caller's own are kept
    keras_internals.set_uninitialized_variables([])
    scope = _budgeted_scope()(budget)
    try:
        try:
            with scope, sharing:
                keras.saving.deserialize_keras_object(config, safe_mode=True)
        except Exception:
            if scope.over is not None:  # Keras wraps errors raised while deserialising a layer in its own
                raise scope.over from None
            raise
        if scope.over is not None:
            raise scope.over
        created = keras_internals.uninitialized_variables() or []
        return [_built(v) for v in created]
    finally:
        keras_internals.set_uninitialized_variables(pending)  # ours are dropped, never initialised


@functools.cache
def _budgeted_scope() -> type:
    """keras.StatelessScope (initialize_variables=False) charging a budget for each variable read eagerly that it has no
    value for: Keras's symbolic passes (compute_output_spec) open a scope of their own, so a read that reaches this one
    is a layer reading a variable in `build`, which Keras answers by running the variable's initializer."""

    class BudgetedScope(import_keras().StatelessScope):
        def __init__(self, budget: int):
            super().__init__(initialize_variables=False)
            self.budget, self.read, self.over, self.charged = budget, 0, None, set()

        def get_current_value(self, variable: Any):
            value = super().get_current_value(variable)
            if value is None and id(variable) not in self.charged:
                self.charged.add(id(variable))
                built = _built(variable)
                self.read += built.bytes
                if self.read > self.budget:
                    self.over = VariablesOverBudget(built, self.read, self.budget)
                    raise self.over
            return value

    return BudgetedScope


def _built(variable: Any) -> BuiltVariable:
    return BuiltVariable(str(variable.path), str(variable.dtype), tuple(int(n) for n in variable.shape))


def _itemsize(dtype: str) -> int:
    import ml_dtypes  # Keras's bfloat16, int4 and float8 types

    try:
        return np.dtype(getattr(ml_dtypes, dtype, dtype)).itemsize
    except TypeError:
        return 8  # no NumPy type: counted as the widest


__all__ = ["BuiltVariable", "VariablesOverBudget", "built_variables"]
