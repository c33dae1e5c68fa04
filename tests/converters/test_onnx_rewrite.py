"""rewrite_decompositions: exporters' decompositions replaced by native ops, function unchanged.

Each rewritten model must pass onnx.checker, give onnxruntime outputs equal to the original's
(float32: atol 1e-5, rtol 1e-4) on random inputs, hold only native ops for the rewritten sites
with epsilon == float32(source eps), and leave what the opset cannot hold in place.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import converters
from converters.onnx_adapter.graph.rewrite import rewrite_decompositions
from converters.onnx_adapter.graph.sites import find_norm_sites
from schemas import spec_differences
from schemas.floats import as_float32

from tests.spec_factory import make_spec
from tests.converters.test_onnx_sites import (  # noqa: F401  (folder, torch_block, torch_conv: the same module-scoped exports as there)
    KERAS_CONV_KINDS,
    NATIVE_OPS,
    folder,
    keras_conv_layers,
    keras_model,
    keras_onnx,
    keras_single_cases,
    keras_specs,
    run_onnx,
    torch_block,
    torch_conv,
)

TOLERANCE = dict(atol=1e-5, rtol=1e-4)
#: Ops of the decompositions: none may survive a site's rewrite.
DECOMPOSITION_OPS = {"ReduceMean", "GlobalAveragePool", "Sqrt", "Reciprocal", "Pow", "Neg", "Div"}


def opset_of(model: onnx.ModelProto) -> int:
    return max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def epsilons(model: onnx.ModelProto) -> list[float]:
    """epsilon of each native normalization node, in graph order."""
    return [
        next(helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon")
        for node in model.graph.node
        if node.op_type in NATIVE_OPS
    ]


def assert_same_function(
    original: onnx.ModelProto, rewritten: onnx.ModelProto, shape: tuple[int, ...], seed: int = 0
) -> None:
    onnx.checker.check_model(rewritten, full_check=True)
    for offset in range(2):
        x = np.random.default_rng(seed + offset).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(run_onnx(rewritten, x), run_onnx(original, x), **TOLERANCE)


def inverse_transpose_pairs(model: onnx.ModelProto) -> int:
    """Transpose nodes fed directly by a Transpose with the inverse permutation (what the rewrite should cancel)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    count = 0
    for node in model.graph.node:
        previous = producers.get(node.input[0]) if node.op_type == "Transpose" else None
        if previous is not None and previous.op_type == "Transpose":
            p = helper.get_attribute_value(previous.attribute[0])
            q = helper.get_attribute_value(node.attribute[0])
            count += all(p[q[i]] == i for i in range(len(q)))
    return count


@pytest.fixture(scope="module")
def keras_singles(folder):
    exported = {}
    for case_id, factory, shape, kind, eps in keras_single_cases():
        model = keras_model([factory()], shape, seed=10 + len(exported))
        exported[case_id] = (model, keras_onnx(model, folder), shape, kind, eps)
    return exported


@pytest.fixture(scope="module")
def keras_conv(folder):
    model = keras_model(keras_conv_layers(), (2, 6, 6, 3), seed=4)
    return model, keras_onnx(model, folder)


# -- torch.onnx ----------------------------------------------------------------------------------------


def test_torch_rms_norms_become_native_at_opset_23(torch_block):
    module, model = torch_block
    before = model.SerializeToString()
    rewritten, sites = rewrite_decompositions(model, 23)
    assert model.SerializeToString() == before  # the input is untouched
    assert [(s.kind, s.name, s.eps) for s in sites] == [("rms", "rms", 1e-4), ("rms", "final", 3e-3)]
    assert opset_of(rewritten) == 23
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops.count("RMSNormalization") == 2 and ops.count("LayerNormalization") == 1
    assert not DECOMPOSITION_OPS & set(ops)
    assert epsilons(rewritten) == [as_float32(2e-5), as_float32(1e-4), as_float32(3e-3)]
    assert_same_function(model, rewritten, (2, 3, 8))
    assert [(s.kind, s.native, s.eps) for s in find_norm_sites(rewritten)] == [
        ("layer", True, 2e-5),
        ("rms", True, 1e-4),
        ("rms", True, 3e-3),
    ]
    for site, layer in zip(find_norm_sites(rewritten)[1:], (module.rms, module.final)):
        assert not spec_differences(site.spec, converters.to_spec(layer), ignore=("name", "source", "input_rank"))


def test_opset_too_low_leaves_the_decomposition(torch_block):
    _, model = torch_block
    rewritten, sites = rewrite_decompositions(model, 22)
    assert sites == []
    assert opset_of(rewritten) == 18
    assert [n.op_type for n in rewritten.graph.node] == [n.op_type for n in model.graph.node]


def test_torch_group_norm_with_dynamic_batch(torch_conv):
    module, model = torch_conv
    low, none = rewrite_decompositions(model, 20)
    assert none == [] and "GroupNormalization" not in {n.op_type for n in low.graph.node}
    rewritten, sites = rewrite_decompositions(model, 23)
    assert [(s.kind, s.eps) for s in sites] == [("group", 1e-4)]
    assert opset_of(rewritten) == 21  # raised only as far as the rewrite needs
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops.count("GroupNormalization") == 1 and ops.count("InstanceNormalization") == 1 and "Reshape" not in ops
    assert_same_function(model, rewritten, (3, 3, 6, 6))  # another batch size than exported with
    site = find_norm_sites(rewritten)[0]
    assert not spec_differences(site.spec, converters.to_spec(module.body[1]), ignore=("name", "source", "input_rank"))


# -- tf2onnx (Keras) --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", [case[0] for case in keras_single_cases()])
def test_keras_single_layer_becomes_native(keras_singles, case_id):
    model, exported, shape, kind, eps = keras_singles[case_id]
    specs = keras_specs(model) if case_id != "layer_two_axes" else None  # Keras-side reading refuses non-trailing axes
    rewritten, sites = rewrite_decompositions(exported, 23, specs)
    assert [s.kind for s in sites] == [kind]
    ops = {n.op_type for n in rewritten.graph.node}
    assert ops <= set(NATIVE_OPS) | {"Transpose"}, ops
    source_eps = eps if eps is not None else specs[0].eps
    assert epsilons(rewritten) == [as_float32(source_eps)]
    assert_same_function(exported, rewritten, shape)
    if kind == "batch":
        (node,) = [n for n in rewritten.graph.node if n.op_type == "BatchNormalization"]
        initializers = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
        for name, field in zip(node.input[1:], ("scale", "bias", "running_mean", "running_var")):
            assert initializers[name].tobytes() == specs[0].tensors[field].tobytes(), field
        assert sites[0].folded and sites[0].spec is specs[0]


def test_keras_conv_network_every_kind_native_with_transposes_cancelled(keras_conv):
    model, exported = keras_conv
    specs = keras_specs(model)
    rewritten, sites = rewrite_decompositions(exported, 23, specs)
    assert [(s.kind, s.eps) for s in sites] == [(k, e if e is not None else 1e-3) for k, e in KERAS_CONV_KINDS]
    ops = [n.op_type for n in rewritten.graph.node]
    assert not DECOMPOSITION_OPS & set(ops) and "Mul" not in ops and "Reshape" not in ops
    assert [op for op in ops if op in NATIVE_OPS] == [
        "BatchNormalization",
        "LayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "RMSNormalization",
    ]
    assert epsilons(rewritten) == [as_float32(s.eps) for s in specs]
    assert inverse_transpose_pairs(rewritten) == 0
    assert_same_function(exported, rewritten, (2, 6, 6, 3))
    after = find_norm_sites(rewritten)
    assert [(s.kind, s.native) for s in after] == [(k, True) for k, _ in KERAS_CONV_KINDS]
    initializers = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    batch_node = next(n for n in rewritten.graph.node if n.op_type == "BatchNormalization")
    for name, field in zip(batch_node.input[1:], ("scale", "bias", "running_mean", "running_var")):
        assert initializers[name].tobytes() == specs[0].tensors[field].tobytes()


def test_keras_opset_is_raised_only_when_allowed(keras_singles):
    _, exported, shape, _, _ = keras_singles["layer_last"]
    assert opset_of(exported) == 15
    same, none = rewrite_decompositions(exported, 16)
    assert none == [] and opset_of(same) == 15 and "LayerNormalization" not in {n.op_type for n in same.graph.node}
    raised, sites = rewrite_decompositions(exported, 17)
    assert [s.kind for s in sites] == ["layer"] and opset_of(raised) == 17
    assert_same_function(exported, raised, shape)


def test_folded_batchnorm_needs_matching_source_specs(keras_singles):
    model, exported, _, _, _ = keras_singles["batch"]
    spec = keras_specs(model)[0]
    _, without = rewrite_decompositions(exported, 23)
    assert without == []  # eps and statistics are gone from the graph: nothing to rewrite with
    other_eps = spec.replace(eps=spec.eps * 50)
    other_stats = spec.replace(tensors={**spec.tensors, "running_mean": spec.tensors["running_mean"] + 0.01})
    layer = make_spec("layer", normalized_shape=(4,))
    for wrong in ([other_eps], [other_stats], [layer]):
        unchanged, sites = rewrite_decompositions(exported, 23, wrong)
        assert sites == [] and "BatchNormalization" not in {n.op_type for n in unchanged.graph.node}
    _, sites = rewrite_decompositions(exported, 23, [layer, other_eps, spec])  # skips to the batch spec that agrees
    assert [s.spec for s in sites] == [spec]


# -- normbridge's own decompositions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, opset, dtype, eps, shape",
    [
        ("layer", 15, "float32", 2e-5, (2, 3, 4, 5)),
        ("layer", 16, "float16", 1e-3, (2, 3, 4, 5)),
        ("rms", 18, "float32", 3e-3, (2, 3, 4, 5)),
        ("rms", 22, "float64", 1e-4, (2, 3, 4, 5)),
        ("group", 18, "float32", 1e-4, (2, 6, 3, 3)),
    ],
)
def test_normbridge_decompositions_round_trip(kind, opset, dtype, eps, shape):
    spec = make_spec(kind, dtype=dtype, eps=eps, num_features=6, num_groups=3)
    model = converters.from_spec(spec, "onnx", opset=opset)
    rewritten, sites = rewrite_decompositions(model, 23)
    assert [(s.kind, s.origin) for s in sites] == [(kind, "normbridge")]
    assert [n.op_type for n in rewritten.graph.node] == [
        {"layer": "LayerNormalization", "rms": "RMSNormalization", "group": "GroupNormalization"}[kind]
    ]
    assert epsilons(rewritten) == [as_float32(eps)]
    # the rewritten one-layer model reads back as the spec it was written from
    assert not spec_differences(converters.to_spec(rewritten), spec, ignore=("source", "layout", "input_rank"))
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    tolerance = dict(atol=2e-2, rtol=2e-2) if dtype == "float16" else TOLERANCE
    np.testing.assert_allclose(
        run_onnx(rewritten, x).astype(np.float64), run_onnx(model, x).astype(np.float64), **tolerance
    )


def test_folded_batchnorms_pair_with_specs_given_in_another_order():
    """Exporters may order parallel branches unlike the source (a ResNet shortcut and main path)."""
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper

    from converters.onnx_adapter.graph.rewrite import rewrite_decompositions

    from tests.spec_factory import make_spec

    specs = [make_spec("batch", name=f"b{i}", seed=i, num_features=4, eps=1e-3) for i in (1, 2)]
    nodes, inits = [], []
    for spec in specs:
        t = spec.tensors
        k = t["scale"].astype(np.float64) / np.sqrt(t["running_var"].astype(np.float64) + spec.eps)
        offset = t["bias"].astype(np.float64) - t["running_mean"].astype(np.float64) * k
        inits += [
            numpy_helper.from_array(k.astype(np.float32).reshape(1, 4, 1, 1), f"{spec.name}_k"),
            numpy_helper.from_array(offset.astype(np.float32).reshape(1, 4, 1, 1), f"{spec.name}_o"),
        ]
        nodes += [
            helper.make_node("Mul", ["X", f"{spec.name}_k"], [f"{spec.name}_m"], name=f"{spec.name}/batchnorm/mul"),
            helper.make_node(
                "Add", [f"{spec.name}_m", f"{spec.name}_o"], [f"Y_{spec.name}"], name=f"{spec.name}/batchnorm/add"
            ),
        ]
    shape = ["N", 4, 3, 3]
    graph = helper.make_graph(
        nodes,
        "parallel",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(f"Y_{s.name}", TensorProto.FLOAT, shape) for s in specs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rewritten, sites = rewrite_decompositions(model, 23, list(reversed(specs)))
    assert sorted(s.name for s in sites) == ["b1", "b2"]
    assert [n.op_type for n in rewritten.graph.node].count("BatchNormalization") == 2
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 3)).astype(np.float32)
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"X": x})
    after = ort.InferenceSession(rewritten.SerializeToString()).run(None, {"X": x})
    for a, b in zip(before, after):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-4)


def _bfloat16_export(module, shape) -> onnx.ModelProto:
    """A bfloat16 module on a bfloat16 input as `normbridge export` writes it before its rewrite:
    torch.onnx.export(dynamo=True) with its optimizer off, constants folded
    (onnxruntime cannot run it on CPU: the graph is only read)."""
    import onnxscript.optimizer
    import torch

    from tests.converters.test_onnx_sites import quiet

    with quiet():
        program = torch.onnx.export(
            module, (torch.randn(*shape, dtype=torch.bfloat16),), dynamo=True, opset_version=23, optimize=False
        )
    onnxscript.optimizer.fold_constants(program.model)
    onnxscript.optimizer.remove_unused_nodes(program.model)
    return program.model_proto


def test_a_bfloat16_rms_norm_weighted_after_its_cast_back_is_one_native_site_with_its_weight():
    """LlamaRMSNorm in bfloat16: statistics in float32, cast back, then `weight * x` with a bfloat16 weight: the weight
    (a bfloat16 constant) is the site's scale, so export verifies it (it used to be left outside, the site reading scale
    1)."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from tests import real_norms as R

    norm = R.randomise(LlamaRMSNorm(8, eps=3e-6)).to(torch.bfloat16)
    model = _bfloat16_export(norm, (2, 3, 8))
    spec = converters.to_spec(norm)
    rewritten, sites = rewrite_decompositions(model, 23, [spec])
    [site] = find_norm_sites(rewritten)
    assert (site.kind, site.native, site.spec.dtype) == ("rms", True, "bfloat16") and np.float32(
        site.eps
    ) == np.float32(3e-6)
    assert np.array_equal(site.spec.tensors["scale"].astype(np.float32), spec.tensors["scale"].astype(np.float32))
    assert [n.op_type for n in rewritten.graph.node] == ["RMSNormalization"]


def test_a_bfloat16_frozen_batchnorm_folded_into_bfloat16_constants_is_unfolded_with_its_spec():
    """DETR's frozen BatchNorm computes its folded scale and offset in bfloat16; they agree with the spec's to bfloat16
    rounding, so the folded Mul/Add pair with it and become a native BatchNormalization holding its exact statistics."""
    import torch

    from tests import real_norms as R

    norm = R.randomise(R.FrozenBatchNorm2d(6, eps=2e-5)).to(torch.bfloat16)
    model = _bfloat16_export(norm, (2, 6, 3, 3))
    spec = converters.to_spec(norm)
    assert spec.frozen and spec.dtype == "bfloat16"
    rewritten, sites = rewrite_decompositions(model, 23, [spec])
    [site] = find_norm_sites(rewritten)
    assert (site.kind, site.native, site.spec.dtype) == ("batch", True, "bfloat16") and np.float32(
        site.eps
    ) == np.float32(2e-5)
    for name in ("running_mean", "running_var", "scale", "bias"):
        assert np.array_equal(site.spec.tensors[name], spec.tensors[name]), name
