"""PyTorch's own module-test inputs for every normalization module, converted to ONNX and Keras at the input's rank.

`torch.testing._internal.common_modules.module_db` lists, per module, the constructor arguments and
inputs torch tests it with: BatchNorm1d on (N, C) and (N, C, L), GroupNorm on (N, C) and (N, C, L),
LayerNorm([2, 2, 5]) on (4, 2, 2, 5), empty batches, unbatched InstanceNorm inputs. Each module (given
a random state) is read into a spec, converted with `input_rank=` the sample's rank, and run in eval
and one training step; every output and updated statistic is compared with the NumPy reference.
A bounded, deterministic subset of the samples runs (every distinct input rank of each module first).
"""

from __future__ import annotations

import sys
import types
import unittest
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from converters import REGISTRY, from_spec, reference, to_spec  # noqa: E402
from converters.equivalence import output_tolerances, training_tolerances  # noqa: E402
from converters.layout import from_channels_first, to_channels_first  # noqa: E402
from schemas import NotExpressibleError  # noqa: E402
from schemas.kinds import KIND_INFO  # noqa: E402

pytestmark = pytest.mark.slow

#: Samples per module: enough to cover every input rank torch tests a module with.
PER_MODULE = 4
TORCH_CLASSES = {name for info in KIND_INFO.values() for name in info.classes["torch"]}


def _module_db():
    """torch's module_db; its test utilities import `expecttest` (a torch dev dependency not installed here) only for a
    TestCase base class, so a plain unittest stand-in is registered when it is missing."""
    if "expecttest" not in sys.modules:
        try:
            import expecttest  # noqa: F401
        except ImportError:
            stand_in = types.ModuleType("expecttest")
            stand_in.TestCase = unittest.TestCase
            sys.modules["expecttest"] = stand_in
    from torch.testing._internal.common_modules import module_db

    return module_db


def _chosen(samples: list) -> list:
    """Every distinct input rank once, then the rest in a fixed pseudo-random order, up to PER_MODULE."""
    order = sorted(samples, key=lambda s: zlib.crc32(s.desc.encode()))
    chosen, ranks = [], set()
    for sample in order:
        if sample.forward_input.args[0].ndim not in ranks:
            ranks.add(sample.forward_input.args[0].ndim)
            chosen.append(sample)
    chosen += [s for s in order if s not in chosen]
    return chosen[:PER_MODULE]


def _cases():
    cases = []
    for info in _module_db():
        name = info.module_cls.__name__
        if name not in TORCH_CLASSES:
            continue
        samples = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=False, training=False)
        for sample in _chosen(samples):
            cases.append(pytest.param(info.module_cls, sample, id=f"{name}-{sample.desc or 'default'}"))
    return cases


CASES = _cases()


def _randomised(module_cls, sample):
    """The module with a random state (weights, running statistics), so a dropped tensor changes the output."""
    torch.manual_seed(zlib.crc32(sample.desc.encode()))
    module = module_cls(*sample.constructor_input.args, **sample.constructor_input.kwargs)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5 + 1.0)
        if getattr(module, "running_mean", None) is not None:
            module.running_mean.copy_(torch.randn_like(module.running_mean) * 0.3)
            module.running_var.copy_(torch.rand_like(module.running_var) + 0.5)
            module.num_batches_tracked.fill_(3)
    return module.eval()


def _input(module, sample) -> tuple[np.ndarray, str]:
    """The sample's input as the spec reads it, and a note: an unbatched InstanceNorm input (C, L) gets a batch axis of
    1, which is what torch computes for it (its docs); the spec, like ONNX and Keras, always has a batch axis."""
    x = sample.forward_input.args[0].detach().numpy().astype(np.float32)
    spatial = {"InstanceNorm1d": 1, "InstanceNorm2d": 2, "InstanceNorm3d": 3}.get(type(module).__name__)
    if spatial is not None and x.ndim == spatial + 1:
        return x[None], "unbatched"
    return x, ""


def _options(spec, target: str) -> dict:
    options = {}
    if spec.kind in ("batch", "instance") and spec.track_running_stats and spec.momentum is None:
        options["cumulative_momentum"] = "next_step"
    if target == "onnx" and spec.kind == "batch" and not spec.track_running_stats:
        options["onnx_training_mode"] = True
    return options


#: (target, kind, condition) -> the setting the target refuses, with the reason (issue 13 item 11 is elsewhere).
def _refused_setting(spec, target: str) -> str | None:
    if target == "keras" and spec.kind == "batch" and not spec.track_running_stats:
        return "track_running_stats"  # Keras BatchNormalization always uses its moving statistics at inference
    if target == "keras" and spec.kind == "instance" and spec.track_running_stats and spec.momentum is None:
        # a tracked InstanceNorm becomes a BatchNormalization (exact at eval), which has no cumulative average
        return "momentum"
    return None


@pytest.mark.parametrize("target", ["onnx", "keras"])
@pytest.mark.parametrize("module_cls,sample", CASES)
def test_module_db_sample_converts_at_its_rank(module_cls, sample, target):
    module = _randomised(module_cls, sample)
    x, note = _input(module, sample)
    spec = to_spec(module)
    torch_out = module(torch.from_numpy(x)).detach().numpy()
    expected = reference.forward(spec, x, training=False)
    np.testing.assert_allclose(
        torch_out, expected, atol=1e-5, rtol=1e-4, err_msg="torch differs from the reference: the oracle is wrong"
    )

    refused = _refused_setting(spec, target)
    if refused is not None:
        with pytest.raises(NotExpressibleError) as error:
            from_spec(spec, target, input_rank=x.ndim, **_options(spec, target))
        assert (error.value.layer, error.value.setting) == (spec.name, refused)
        return
    obj = from_spec(spec, target, input_rank=x.ndim, **_options(spec, target))
    framework = REGISTRY.framework_of(obj)
    target_spec = to_spec(obj)
    assert target_spec.input_rank == x.ndim, f"{target} layer not built for the sample's rank {x.ndim}"
    layout = target_spec.layout if not KIND_INFO[spec.kind].trailing else None

    y = to_channels_first(np.asarray(framework.run_eval(obj, from_channels_first(x, layout))), layout)
    atol, rtol = output_tolerances(framework, spec, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(y, expected, atol=atol, rtol=rtol, err_msg=f"{target} eval on {x.shape} {note}")

    if x.shape[0] == 0:
        # an empty batch has no batch statistics: issue 13 item 10 (torch keeps its statistics, Keras and onnxruntime
        # write NaN)
        return
    if target == "keras" and spec.kind == "instance" and spec.track_running_stats:
        # held as a BatchNormalization: exact at eval (above); its training step uses batch statistics,
        # as the report warns
        return
    if target == "onnx" and spec.kind == "instance" and spec.track_running_stats:
        with pytest.raises(NotExpressibleError) as error:
            framework.run_train_step(obj, x)
        assert error.value.setting == "training"
        return
    y, mean, var = framework.run_train_step(obj, from_channels_first(x, layout))
    step = reference.train_step(target_spec, x)
    y = to_channels_first(np.asarray(y), layout)
    atol, rtol = output_tolerances(framework, spec, float(np.max(np.abs(step.output))))
    np.testing.assert_allclose(
        y, step.output, atol=atol, rtol=rtol, err_msg=f"{target} training-step output on {x.shape}"
    )
    if step.running_mean is None:
        return
    tol_mean, tol_var = training_tolerances(framework, target_spec, x, step)
    np.testing.assert_allclose(
        mean, step.running_mean, atol=tol_mean, rtol=0, err_msg=f"{target} running mean after one step"
    )
    np.testing.assert_allclose(
        var, step.running_var, atol=tol_var, rtol=0, err_msg=f"{target} running var after one step"
    )


def test_every_normalization_module_of_module_db_is_covered():
    """A module torch adds to module_db that normbridge reads must come with samples here
    (LocalResponseNorm is no kind)."""
    covered = {case.values[0].__name__ for case in CASES}
    listed = {info.module_cls.__name__ for info in _module_db() if "Norm" in info.module_cls.__name__}
    assert listed - covered <= {"LocalResponseNorm"}, listed - covered
    assert {"BatchNorm1d", "GroupNorm", "InstanceNorm1d", "LayerNorm", "RMSNorm"} <= covered


@pytest.mark.parametrize("module_cls,sample", CASES)
def test_module_db_sample_runs_in_keras_converted_without_a_rank(module_cls, sample):
    """No `input_rank=`: the layer Keras gets takes the sample's rank on its first call (a BatchNorm1d's (N, C) as well
    as (N, C, L), a GroupNorm's any rank), in eval and in one training step, with the state bit-exact once built."""
    module = _randomised(module_cls, sample)
    x, _ = _input(module, sample)
    spec = to_spec(module)
    refused = _refused_setting(spec, "keras")
    if refused is not None:
        return  # refused at every rank, naming the setting: test_module_db_sample_converts_at_its_rank
    options = _options(spec, "keras")
    layout = None if KIND_INFO[spec.kind].trailing else "channels_last"
    x_keras = from_channels_first(x, layout)
    layer = from_spec(spec, "keras", **options)
    y = to_channels_first(np.asarray(layer(x_keras, training=False)), layout)
    expected = reference.forward(spec, x, training=False)
    atol, rtol = output_tolerances(REGISTRY.framework("keras"), spec, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(y, expected, atol=atol, rtol=rtol, err_msg=f"keras eval on {x.shape}, first call")
    built = to_spec(layer)
    if not KIND_INFO[
        spec.kind
    ].trailing:  # a trailing-axes layer is built for one rank and takes any (test_keras_ranks.py)
        assert built.input_rank == x.ndim
    assert all(
        np.array_equal(built.tensors[name], spec.tensors[name])
        for name in spec.tensors
        if name != "num_batches_tracked"
    )

    if x.shape[0] == 0 or (spec.kind == "instance" and spec.track_running_stats):
        return  # as in test_module_db_sample_converts_at_its_rank
    layer = from_spec(spec, "keras", **options)
    target_spec = to_spec(layer)  # read before the step (from a built copy when the layer waits for its first call)
    y = to_channels_first(np.asarray(layer(x_keras, training=True)), layout)
    step = reference.train_step(target_spec, x)
    atol, rtol = output_tolerances(REGISTRY.framework("keras"), spec, float(np.max(np.abs(step.output))))
    np.testing.assert_allclose(
        y, step.output, atol=atol, rtol=rtol, err_msg=f"keras training step on {x.shape}, first call"
    )
    if step.running_mean is not None:
        tol_mean, tol_var = training_tolerances(REGISTRY.framework("keras"), target_spec, x, step)
        np.testing.assert_allclose(np.asarray(layer.moving_mean.numpy()), step.running_mean, atol=tol_mean, rtol=0)
        np.testing.assert_allclose(np.asarray(layer.moving_variance.numpy()), step.running_var, atol=tol_var, rtol=0)
