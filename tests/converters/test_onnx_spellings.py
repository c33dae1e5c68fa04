"""Normalizations as other writers spell them in ONNX, found by `inspect` with kind, axes and eps,
proved in onnxruntime.

- ONNX's own function bodies: the `_expanded` node tests the onnx package generates for LayerNormalization,
  GroupNormalization and RMSNormalization (BatchNormalization and InstanceNormalization have no function body).
  As generated, their scale and bias are graph inputs: the site is listed with its kind and eps, and its spec is
  refused naming the tensor. With the test's W and B stored as initializers (a deployed model), the spec is read,
  and the graph run in onnxruntime on the test's own input equals the NumPy reference of that spec.
- ONNX's native node tests of all five ops (BatchNormalization's training-mode ones included), their inputs stored as
  initializers: read as the reference computes them, and converted to torch and Keras.
- torch.onnx (dynamo): a hand-rolled RMSNorm (rsqrt, and sqrt with a division) and LayerNorm at every opset from 13
  to 23 (torch writes opset 18 when asked for less: its down-conversion of ReduceMean's axes fails), and GroupNorm
  with optimize=False.
- ONNX LayerNormalization/RMSNormalization with axis=0 (normalise everything).
"""

from __future__ import annotations

import contextlib
import importlib
import io

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from converters import REGISTRY, check, from_spec, reference, to_spec
from converters.onnx_adapter.graph.sites import find_norm_sites
from schemas import SpecError

OPS = {
    "LayerNormalization": ("layernormalization", "layer"),
    "GroupNormalization": ("groupnormalization", "group"),
    "RMSNormalization": ("rmsnormalization", "rms"),
}


OLD_CASE_MODULES = {"batch_normalization": "batchnorm", "instance_normalization": "instancenorm"}


def _node_cases():
    """The onnx package's node test cases of the five ops (importing a case module generates them); only
    LayerNormalization, GroupNormalization and RMSNormalization have function bodies, so `_expanded` cases."""
    from onnx.backend.test.case import node

    for module in [m for m, _ in OPS.values()] + ["batch_normalization", "instance_normalization"]:
        try:
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
        except ModuleNotFoundError:  # older onnx (1.19) names these two batchnorm and instancenorm
            importlib.import_module(f"onnx.backend.test.case.node.{OLD_CASE_MODULES[module]}")
    prefixes = (
        "test_layer_normalization",
        "test_group_normalization",
        "test_rms_normalization",
        "test_batchnorm",
        "test_instancenorm",
    )
    return {case.name: case for case in node._NodeTestCases if case.name.startswith(prefixes)}


CASES = _node_cases()
EXPANDED = sorted(name for name in CASES if "_expanded" in name)
NATIVE = sorted(name for name in CASES if "_expanded" not in name)


def _native_of(name: str):
    """The native test a function-body test expands (its node holds the attributes to compare with)."""
    base = name.split("_expanded")[0]
    (native,) = [n for n in CASES[base].model.graph.node if n.op_type in OPS]
    return native


def _attribute(node, key, default):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == key), default)


def _baked(case) -> onnx.ModelProto:
    """The case's model with every input but X stored as an initializer holding the test's values."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs = case.data_sets[0][0]
    data = model.graph.input[0].name
    for value_info, value in zip(list(model.graph.input)[1:], inputs[1:]):
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), value_info.name))
    kept = [model.graph.input[0]]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    assert model.graph.input[0].name == data
    return model


def test_the_node_tests_were_generated():
    assert len(EXPANDED) >= 40, EXPANDED
    assert {n.split("_normalization")[0] for n in EXPANDED} == {"test_layer", "test_group", "test_rms"}
    assert {n.split("_")[1] for n in NATIVE} == {"batchnorm", "instancenorm", "layer", "group", "rms"}


@pytest.mark.parametrize("name", NATIVE)
def test_a_native_node_test_is_read_as_the_reference_computes_it_and_converts(name):
    """Every native node test of the five ops, its inputs stored as initializers: the spec read from the node gives the
    test's own expected output through the NumPy reference (and, in training mode, its updated statistics); converted
    to torch and Keras it computes that output, or the refusal names the layer and the setting."""
    from converters.layout import from_channels_first, to_channels_first
    from schemas import NotExpressibleError
    from schemas.kinds import KIND_INFO

    case = CASES[name]
    model = _baked(case)
    del model.graph.output[1:]  # LayerNormalization's Mean and InvStdDev are not the layer's output
    (site,) = find_norm_sites(model)
    spec = site.spec
    assert spec is not None and site.native, site.problem
    x, expected = np.asarray(case.data_sets[0][0][0]), [np.asarray(a) for a in case.data_sets[0][1]]
    if spec.training:
        step = reference.train_step(spec, x)
        np.testing.assert_allclose(step.output, expected[0], atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(step.running_mean, expected[1], atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(step.running_var, expected[2], atol=1e-5, rtol=1e-4)
        return
    np.testing.assert_allclose(reference.forward(spec, x, training=False), expected[0], atol=1e-5, rtol=1e-4)
    for target in ("torch", "keras"):
        try:
            obj = from_spec(spec, target, input_rank=x.ndim)
        except NotExpressibleError as refused:
            assert refused.layer == spec.name and refused.setting, (target, refused)
            continue
        layout = None if KIND_INFO[spec.kind].trailing and spec.layout != "channels_first" else to_spec(obj).layout
        y = to_channels_first(
            np.asarray(REGISTRY.framework(target).run_eval(obj, from_channels_first(x, layout))), layout
        )
        np.testing.assert_allclose(y, expected[0], atol=1e-5, rtol=1e-4, err_msg=target)


@pytest.mark.parametrize("name", EXPANDED)
def test_function_body_is_listed_with_its_kind_and_eps(name):
    native = _native_of(name)
    _, kind = OPS[native.op_type]
    (site,) = find_norm_sites(CASES[name].model)
    assert site.kind == kind and not site.native
    assert site.eps == pytest.approx(_attribute(native, "epsilon", 1e-5), rel=1e-6)
    assert site.spec is None and isinstance(site.problem, SpecError) and site.problem.setting == "scale"


@pytest.mark.parametrize("name", EXPANDED)
def test_function_body_with_stored_weights_reads_exactly_and_runs_as_the_reference(name):
    import onnxruntime

    case, native = CASES[name], _native_of(name)
    model = _baked(case)
    (site,) = find_norm_sites(model)
    spec = site.spec
    assert spec is not None, site.problem
    x = np.asarray(case.data_sets[0][0][0])
    if native.op_type == "GroupNormalization":
        assert (spec.kind, spec.num_groups, spec.num_features) == (
            "group",
            _attribute(native, "num_groups", None),
            x.shape[1],
        )
    else:
        axis = _attribute(native, "axis", -1)
        axis = axis + x.ndim if axis < 0 else axis
        assert spec.normalized_shape == x.shape[axis:], (spec.normalized_shape, x.shape, axis)
    assert spec.eps == pytest.approx(_attribute(native, "epsilon", 1e-5), rel=1e-6)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = session.run([model.graph.output[0].name], {model.graph.input[0].name: x})[0]
    np.testing.assert_allclose(y, reference.forward(spec, x, training=False), atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(y, case.data_sets[0][1][0], atol=1e-5, rtol=1e-4)


# -- axis=0 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization"])
def test_axis_zero_is_read_and_written(op):
    rng = np.random.default_rng(3)
    shape = (4, 5, 5)
    tensors = [numpy_helper.from_array(rng.uniform(0.5, 2.0, shape).astype(np.float32), "scale")]
    if op == "LayerNormalization":
        tensors.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), "bias"))
    node = helper.make_node(op, ["X"] + [t.name for t in tensors], ["Y"], axis=0, epsilon=1e-3, name="whole")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, list(shape))],
        initializer=tensors,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    spec = to_spec(model)
    assert (spec.normalized_shape, spec.input_rank, spec.eps) == (shape, 3, 1e-3)
    assert check(spec).passed
    x = rng.standard_normal(shape).astype(np.float32)
    for target in ("torch", "onnx", "keras"):
        obj = from_spec(spec, target)
        y = REGISTRY.framework_of(obj).run_eval(obj, x)
        np.testing.assert_allclose(y, reference.forward(spec, x), atol=1e-5, rtol=1e-4, err_msg=target)
        assert to_spec(obj).normalized_shape == shape


# -- momentum of untracked layers -------------------------------------------------------------


@pytest.mark.parametrize("through", ["onnx", "keras"])
def test_untracked_momentum_survives_round_trips(through):
    torch = pytest.importorskip("torch")
    module = torch.nn.InstanceNorm2d(3, momentum=0.3, affine=True)
    spec = to_spec(module)
    assert (spec.momentum, spec.momentum_convention, spec.track_running_stats) == (0.3, "batch_weight", False)
    back = from_spec(to_spec(from_spec(spec, through)), "torch")
    assert back.momentum == 0.3 and not back.track_running_stats


def test_untracked_batchnorm_momentum_survives_onnx():
    torch = pytest.importorskip("torch")
    module = torch.nn.BatchNorm1d(4, momentum=0.3, track_running_stats=False)
    model = from_spec(to_spec(module), "onnx", onnx_training_mode=True, input_rank=2)
    assert from_spec(to_spec(model), "torch").momentum == 0.3


# -- rank reports -----------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["onnx", "keras"])
def test_a_rank_the_source_does_not_record_is_reported(target):
    torch = pytest.importorskip("torch")
    from converters import convert_with_report

    obj, report = convert_with_report(torch.nn.BatchNorm1d(3).eval(), target)
    (rank,) = [t for t in report.layers[0].translations if t.setting == "input_rank"]
    # ONNX fixes rank 3 (the IR wants a shaped input); Keras builds the layer on its first call
    # (BatchNorm1d takes 2 and 3).
    expected = 3 if target == "onnx" else "rank of the first input"
    assert rank.fate == "translated" and rank.target_value == expected and "input_rank=" in rank.note
    obj, report = convert_with_report(torch.nn.BatchNorm1d(3).eval(), target, input_rank=2)
    (rank,) = [t for t in report.layers[0].translations if t.setting == "input_rank"]
    assert rank.target_value == 2
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    assert REGISTRY.framework_of(obj).run_eval(obj, x).shape == (5, 3)  # (N, C), the usual place after a Linear


def test_onnx_says_why_the_rank_is_fixed():
    torch = pytest.importorskip("torch")
    from converters import convert_with_report

    _, report = convert_with_report(torch.nn.LayerNorm([2, 2, 5]), "onnx", input_rank=4)
    (rank,) = [t for t in report.layers[0].translations if t.setting == "input_rank"]
    assert "ONNX IR requires" in rank.note and rank.target_value == 4


# -- torch.onnx ---------------------------------------------------------------------------------


def _torch_graph(norm, opset, example, **options):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Identity(), norm).eval()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return torch.onnx.export(
            net, (example,), dynamo=True, opset_version=opset, verbose=False, external_data=False, **options
        ).model_proto


def _run(model, x):
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {model.graph.input[0].name: x})[0]


def _hand_rolled(torch, form: str):
    """A hand-rolled norm over the last axis as models write them: RMS with rsqrt, RMS with sqrt and a division (the
    `Pow, ReduceMean, Add, Sqrt, Div, Mul, Mul` chain torch.onnx writes below opset 23),
    a LayerNorm with mean and var."""

    class Hand(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)
            self.bias = torch.nn.Parameter(torch.randn(16))

        def forward(self, x):
            if form == "rms-rsqrt":
                return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
            if form == "rms-sqrt-div":
                return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
            mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
            return (x - mean) / torch.sqrt(var + 1e-6) * self.weight + self.bias

    return Hand()


@pytest.mark.slow
@pytest.mark.parametrize("form,kind", [("rms-rsqrt", "rms"), ("rms-sqrt-div", "rms"), ("layer-mean-var", "layer")])
@pytest.mark.parametrize("opset", list(range(13, 24)))
def test_torch_onnx_hand_rolled_norms_at_every_opset(opset, form, kind):
    torch = pytest.importorskip("torch")
    torch.manual_seed(opset)
    x = torch.randn(2, 5, 16)
    model = _torch_graph(_hand_rolled(torch, form), opset, x)
    (site,) = find_norm_sites(model)
    assert (site.kind, site.eps, site.spec.normalized_shape) == (kind, 1e-6, (16,))
    np.testing.assert_allclose(_run(model, x.numpy()), reference.forward(site.spec, x.numpy()), atol=1e-5, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("opset", [18, 20])
def test_torch_onnx_group_norm_without_optimisation_is_a_group_norm(opset):
    torch = pytest.importorskip("torch")
    norm = torch.nn.GroupNorm(4, 8, eps=1e-4)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.normal_()
    x = torch.randn(2, 8, 5, 5)
    model = _torch_graph(norm, opset, x, optimize=False)
    (site,) = find_norm_sites(model)
    assert (site.kind, site.eps, site.spec.num_groups) == ("group", 1e-4, 4)
    np.testing.assert_allclose(_run(model, x.numpy()), reference.forward(site.spec, x.numpy()), atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(site.spec.tensors["scale"], norm.weight.detach().numpy())


@pytest.mark.slow
@pytest.mark.parametrize(
    "form,kind", [("rms-rsqrt", "rms"), ("rms-sqrt-div", "rms"), ("layer-mean-var", "layer"), ("group", "group")]
)
def test_onnxsim_s_spellings_of_torch_onnx_graphs_are_recognised(form, kind):
    """onnxsim (a test dependency: pyproject's `test` extra) simplifies what torch.onnx wrote; the simplified graph's
    norm is found with its kind and eps and computes the reference of the spec read from it."""
    onnxsim = pytest.importorskip("onnxsim")
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    if form == "group":
        norm, x, options = torch.nn.GroupNorm(4, 8, eps=1e-6), torch.randn(2, 8, 5, 5), {"optimize": False}
    else:
        norm, x, options = _hand_rolled(torch, form), torch.randn(2, 5, 16), {}
    simplified, ok = onnxsim.simplify(_torch_graph(norm, 18, x, **options))
    assert ok
    (site,) = find_norm_sites(simplified)
    assert (site.kind, site.eps) == (kind, 1e-6) and site.spec is not None
    np.testing.assert_allclose(
        _run(simplified, x.numpy()), reference.forward(site.spec, x.numpy()), atol=1e-5, rtol=1e-4
    )


@pytest.mark.slow
def test_onnxsim_folds_an_eval_batchnorm_into_its_conv_and_the_fold_is_named():
    onnxsim = pytest.importorskip("onnxsim")
    torch = pytest.importorskip("torch")
    from converters.onnx_adapter.graph.sites import batchnorm_folded_into_conv

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).eval()
    simplified, ok = onnxsim.simplify(_torch_graph(net, 18, torch.randn(1, 3, 8, 8)))
    assert ok and [n.op_type for n in simplified.graph.node] == ["Conv"]
    assert batchnorm_folded_into_conv(simplified) and not find_norm_sites(simplified)
