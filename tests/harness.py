"""One harness: run an object in its framework and compare with the NumPy reference."""

from __future__ import annotations

import numpy as np

from converters import REGISTRY, reference
from converters.api import read_spec
from converters.equivalence import TOLERANCES, output_tolerances
from converters.layout import from_channels_first, to_channels_first
from converters.probe import probe_input
from schemas import NormSpec

#: assert_allclose arguments per dtype: the tolerances `check` uses (converters.equivalence.TOLERANCES).
TOLERANCE = {dtype: dict(atol=atol, rtol=rtol) for dtype, (atol, rtol) in TOLERANCES.items()}
#: Keras computes float16 statistics in float32 and float64 ones exactly, so its layers are held to tighter bounds.
KERAS_TOLERANCE = {**TOLERANCE, "float16": dict(atol=3e-3, rtol=3e-3), "float64": dict(atol=1e-10, rtol=1e-10)}


def framework_output(obj, spec_of_obj: NormSpec, x_cf: np.ndarray) -> np.ndarray:
    """Eval output of `obj` on channels-first `x_cf`, returned channels-first."""
    framework = REGISTRY.framework_of(obj)
    out = framework.run_eval(obj, from_channels_first(x_cf, spec_of_obj.layout))
    return to_channels_first(np.asarray(out), spec_of_obj.layout)


def assert_matches_reference(obj, spec: NormSpec, *, training: bool = False) -> None:
    """`obj` computes what `spec` describes (eval mode), within the dtype's tolerance."""
    obj_spec, _ = read_spec(obj)
    x = probe_input(spec)
    expected = reference.forward(spec, x, training=training)
    actual = framework_output(obj, obj_spec, x).astype(np.float64)
    atol, rtol = output_tolerances(REGISTRY.framework_of(obj), spec, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(
        actual, expected, atol=atol, rtol=rtol, err_msg=f"{spec.name}: output differs from the NumPy reference"
    )
