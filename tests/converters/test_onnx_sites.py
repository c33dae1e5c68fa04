"""find_norm_sites and batchnorm_folded_into_conv on graphs the real exporters produce.

Every decomposition here comes from torch.onnx.export(dynamo=True), Keras model.export(format="onnx")
(tf2onnx) or converters.from_spec at a low opset; nothing is hand-written except the graphs that
must NOT be read as a normalization. Exports are cached in module-scoped fixtures.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import converters
from converters.onnx_adapter.graph.sites import (
    NormSite,
    batchnorm_folded_into_conv,
    find_norm_sites,
)
from schemas import spec_differences
from schemas.tensors import tensors_identical

from tests.spec_factory import make_spec

NATIVE_OPS = (
    "BatchNormalization",
    "LayerNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "RMSNormalization",
)


# -- exporting (shared with test_onnx_rewrite) ---------------------------------------------------


@contextlib.contextmanager
def quiet():
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        yield


def torch_onnx(
    module: nn.Module, shape: tuple[int, ...], opset: int, folder, *, dynamic_batch: bool = False, **options
) -> onnx.ModelProto:
    """torch.onnx.export(dynamo=True) of `module` in its current mode, loaded back."""
    path = folder / f"torch_{id(module)}_{opset}.onnx"
    dynamic = ({0: torch.export.Dim("batch", min=1, max=64)},) if dynamic_batch else None
    with quiet():
        torch.onnx.export(
            module,
            (torch.randn(*shape),),
            str(path),
            dynamo=True,
            opset_version=opset,
            dynamic_shapes=dynamic,
            **options,
        )
    return onnx.load(str(path))


def randomize_torch(module: nn.Module, seed: int = 0) -> nn.Module:
    """Normalization state away from its initial values (so no exporter can elide a Mul by ones)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm, nn.RMSNorm, nn.InstanceNorm2d)):
                if getattr(sub, "weight", None) is not None:
                    sub.weight.copy_(torch.rand(sub.weight.shape, generator=generator) + 0.5)
                if getattr(sub, "bias", None) is not None:
                    sub.bias.copy_(torch.randn(sub.bias.shape, generator=generator) * 0.3)
                if isinstance(sub, nn.BatchNorm2d):
                    sub.running_mean.copy_(torch.randn(sub.running_mean.shape, generator=generator) * 0.3)
                    sub.running_var.copy_(torch.rand(sub.running_var.shape, generator=generator) + 0.5)
    return module.eval()


def keras_model(layers: list, shape: tuple[int, ...], *, randomize: bool = True, seed: int = 0):
    """A Sequential model called once (export needs that), its weights randomised unless asked not to."""
    import keras

    model = keras.Sequential([keras.Input(shape=shape[1:])] + list(layers))
    model(np.zeros(shape, np.float32))
    if randomize:
        rng = np.random.default_rng(seed)
        for layer in model.layers:
            values = []
            for weight in layer.weights:
                name = weight.name
                if name in ("gamma", "scale", "moving_variance"):
                    values.append(rng.uniform(0.5, 1.5, weight.shape).astype(np.float32))
                else:
                    values.append(rng.normal(0.0, 0.5, weight.shape).astype(np.float32))
            if values:
                layer.set_weights(values)
    return model


def keras_onnx(model, folder) -> onnx.ModelProto:
    """Keras 3 model.export(format="onnx") (tf2onnx), loaded back."""
    path = folder / f"keras_{id(model)}.onnx"
    with quiet():
        model.export(str(path), format="onnx", verbose=False)
    return onnx.load(str(path))


def keras_specs(model) -> list:
    from converters.models.walking import norm_layers, spec_of

    return [spec_of(ref) for ref in norm_layers(model)]


def run_onnx(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def summary(sites: list[NormSite]) -> list[tuple]:
    return [(s.kind, s.native, s.eps) for s in sites]


class Block(nn.Module):
    """A small transformer-style block: LayerNorm and RMSNorm before linear layers, residuals, a 2-axis RMSNorm."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8, eps=2e-5)
        self.fc1 = nn.Linear(8, 8)
        self.rms = nn.RMSNorm(8, eps=1e-4)
        self.fc2 = nn.Linear(8, 8)
        self.final = nn.RMSNorm((3, 8), eps=3e-3)

    def forward(self, x):
        h = x + self.fc1(self.ln(x))
        h = h + self.fc2(self.rms(h))
        return self.final(h)


class ConvGroup(nn.Module):
    """Conv -> GroupNorm -> ReLU -> Conv -> InstanceNorm2d (affine)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.GroupNorm(2, 4, eps=1e-4),
            nn.ReLU(),
            nn.Conv2d(4, 4, 1),
            nn.InstanceNorm2d(4, eps=3e-3, affine=True),
        )

    def forward(self, x):
        return self.body(x)


def conv_bn() -> nn.Module:
    return randomize_torch(
        nn.Sequential(
            nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, eps=2e-5), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4, eps=1e-3)
        )
    )


def keras_single_cases():
    """(id, layer factory, input shape, kind, eps): one layer each, every tf2onnx form."""
    import keras

    layers = keras.layers
    return [
        ("layer_last", lambda: layers.LayerNormalization(epsilon=2e-5), (2, 3, 8), "layer", 2e-5),
        ("layer_two_axes", lambda: layers.LayerNormalization(axis=[1, 2], epsilon=1e-4), (2, 3, 8), "layer", 1e-4),
        ("layer_pool", lambda: layers.LayerNormalization(axis=[-2, -1], epsilon=3e-3), (2, 4, 3, 8), "layer", 3e-3),
        ("rms", lambda: layers.RMSNormalization(epsilon=3e-3), (2, 3, 8), "rms", 3e-3),
        ("group", lambda: layers.GroupNormalization(groups=2, epsilon=1e-4), (2, 3, 3, 4), "group", 1e-4),
        ("instance", lambda: layers.GroupNormalization(groups=-1, epsilon=2e-5), (2, 3, 3, 4), "instance", 2e-5),
        ("batch", lambda: layers.BatchNormalization(epsilon=1e-4), (2, 3, 3, 4), "batch", None),
    ]


def keras_conv_layers():
    """Conv, BN, ReLU, Conv, LN, Conv, GN(2), Conv, GN(-1), Conv, RMS: every kind in one channels-last network."""
    import keras

    layers = keras.layers
    return [
        layers.Conv2D(4, 3, padding="same"),
        layers.BatchNormalization(epsilon=1e-3),
        layers.ReLU(),
        layers.Conv2D(4, 1),
        layers.LayerNormalization(epsilon=2e-5),
        layers.Conv2D(4, 1),
        layers.GroupNormalization(groups=2, epsilon=1e-4),
        layers.Conv2D(4, 1),
        layers.GroupNormalization(groups=-1, epsilon=3e-3),
        layers.Conv2D(4, 1),
        layers.RMSNormalization(epsilon=1e-4),
    ]


KERAS_CONV_KINDS = [("batch", None), ("layer", 2e-5), ("group", 1e-4), ("instance", 3e-3), ("rms", 1e-4)]


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx_sites")


@pytest.fixture(scope="module")
def torch_block(folder):
    module = randomize_torch(Block())
    return module, torch_onnx(module, (2, 3, 8), 18, folder)


@pytest.fixture(scope="module")
def torch_conv(folder):
    module = randomize_torch(ConvGroup())
    return module, torch_onnx(module, (2, 3, 6, 6), 18, folder, dynamic_batch=True)


@pytest.fixture(scope="module")
def torch_conv_bn(folder):
    module = conv_bn()
    return (
        module,
        torch_onnx(module, (2, 3, 6, 6), 18, folder),
        torch_onnx(module, (2, 3, 6, 6), 18, folder, optimize=False),
    )


@pytest.fixture(scope="module")
def keras_singles(folder):
    exported = {}
    for case_id, factory, shape, kind, eps in keras_single_cases():
        model = keras_model([factory()], shape, seed=len(exported))
        exported[case_id] = (model, keras_onnx(model, folder), shape, kind, eps)
    return exported


@pytest.fixture(scope="module")
def keras_conv(folder):
    model = keras_model(keras_conv_layers(), (2, 6, 6, 3), seed=3)
    return model, keras_onnx(model, folder)


# -- torch.onnx ---------------------------------------------------------------------------------------


def test_torch_block_sites_in_graph_order(torch_block):
    module, model = torch_block
    sites = find_norm_sites(model)
    # LayerNormalization is native from opset 17; RMSNorm decomposes below 23
    # (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul).
    assert summary(sites) == [("layer", True, 2e-5), ("rms", False, 1e-4), ("rms", False, 3e-3)]
    assert [s.origin for s in sites] == ["native", "torch.onnx", "torch.onnx"]
    assert [s.name for s in sites[1:]] == ["rms", "final"]  # torch.onnx's module scopes name the decompositions
    assert set(sites[1].op_types) == {"Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul"}
    for site, layer in zip(sites, (module.ln, module.rms, module.final)):
        expected = converters.to_spec(layer)
        assert site.spec is not None
        assert site.spec.kind == expected.kind and site.spec.eps == expected.eps
        assert site.spec.normalized_shape == expected.normalized_shape
        assert tensors_identical(site.spec.tensors["scale"], expected.tensors["scale"])
    # every node of a site is in the graph, in graph order
    names = [n.name for n in model.graph.node]
    for site in sites:
        positions = [names.index(n) for n in site.node_names]
        assert positions == sorted(positions)


def test_torch_group_norm_decomposition_with_dynamic_batch(torch_conv):
    module, model = torch_conv
    sites = find_norm_sites(model)
    assert summary(sites) == [("group", False, 1e-4), ("instance", True, 3e-3)]
    group, instance = sites
    assert group.op_types == ("Reshape", "InstanceNormalization", "Shape", "Reshape", "Mul", "Add")
    assert group.origin == "torch.onnx" and group.name == "body.1"
    expected = converters.to_spec(module.body[1])
    assert not spec_differences(group.spec, expected, ignore=("name", "source", "input_rank"))
    # the InstanceNormalization inside the GroupNorm decomposition belongs to it, not to a site of its own
    assert instance.op_types == ("InstanceNormalization",) and not set(instance.node_names) & set(group.node_names)
    assert tensors_identical(instance.spec.tensors["scale"], module.body[4].weight.detach().numpy())


def test_torch_eval_batchnorm_folded_into_conv(torch_conv_bn):
    module, folded, kept = torch_conv_bn
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Relu", "Conv"]
    assert find_norm_sites(folded) == []
    assert batchnorm_folded_into_conv(folded)
    # without the exporter's optimiser the BatchNorms stay, in graph order, with their state
    sites = find_norm_sites(kept)
    assert summary(sites) == [("batch", True, 2e-5), ("batch", True, 1e-3)]
    assert not batchnorm_folded_into_conv(kept)
    for site, layer in zip(sites, (module[1], module[4])):
        assert site.training_mode is False
        for name, tensor in (
            ("running_mean", layer.running_mean),
            ("running_var", layer.running_var),
            ("scale", layer.weight),
        ):
            assert tensors_identical(site.spec.tensors[name], tensor.detach().numpy())


def test_folding_by_hand_is_recognised():
    """A Conv whose weights absorbed the BatchNorm (w * g / sqrt(v + eps), bias folded) and no BN left."""
    rng = np.random.default_rng(0)
    weight, gamma, var = (
        rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
        rng.uniform(0.5, 1.5, 4).astype(np.float32),
        rng.uniform(0.5, 1.5, 4).astype(np.float32),
    )
    k = gamma / np.sqrt(var + 1e-5)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")
    graph = helper.make_graph(
        [conv],
        "folded",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight * k[:, None, None, None], "w"), numpy_helper.from_array(-k * 0.1, "b")],
    )
    folded = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert batchnorm_folded_into_conv(folded)
    with_bn = converters.from_spec(make_spec("batch", num_features=4, eps=1e-5), "onnx", opset=18)
    assert not batchnorm_folded_into_conv(with_bn)  # no Conv at all


# -- tf2onnx (Keras) -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", [case[0] for case in keras_single_cases()])
def test_keras_single_layer_sites(keras_singles, case_id):
    model, exported, _, kind, eps = keras_singles[case_id]
    sites = find_norm_sites(exported)
    assert summary(sites) == [(kind, False, eps)]
    site = sites[0]
    assert site.origin == "tf2onnx"
    assert len(site.node_names) == len(exported.graph.node)  # the whole graph is the layer
    assert site.output == exported.graph.output[0].name and site.input == exported.graph.input[0].name
    if kind == "batch":
        assert site.folded and site.spec is None and site.op_types == ("Mul", "Add")
        assert not batchnorm_folded_into_conv(exported)
        return
    expected = keras_specs(model)[0] if case_id != "layer_two_axes" else None
    assert site.spec is not None and site.spec.eps == eps and site.spec.kind == kind
    if expected is not None:
        assert not spec_differences(site.spec, expected, ignore=("name", "source", "input_rank", "training"))


def test_keras_fresh_group_norms_with_elided_affine(folder):
    """tf2onnx drops an Add of zeros (and a Mul by ones) from untrained layers: still read exactly."""
    import keras

    model = keras_model(
        [
            keras.layers.GroupNormalization(groups=2, epsilon=1e-4),
            keras.layers.GroupNormalization(groups=-1, epsilon=3e-3),
        ],
        (2, 3, 3, 4),
        randomize=False,
    )
    exported = keras_onnx(model, folder)
    sites = find_norm_sites(exported)
    assert summary(sites) == [("group", False, 1e-4), ("instance", False, 3e-3)]
    for site, expected in zip(sites, keras_specs(model)):
        assert np.array_equal(site.spec.tensors.get("scale", np.ones(4, np.float32)), expected.tensors["scale"])
        assert np.array_equal(site.spec.tensors.get("bias", np.zeros(4, np.float32)), expected.tensors["bias"])


def test_keras_conv_network_sites_in_graph_order(keras_conv):
    model, exported = keras_conv
    sites = find_norm_sites(exported)
    assert [(s.kind, s.eps) for s in sites] == KERAS_CONV_KINDS
    assert all(not s.native and s.origin == "tf2onnx" for s in sites)
    assert sites[0].folded and not any(s.folded for s in sites[1:])
    specs = keras_specs(model)
    for site, expected in zip(sites[1:], specs[1:]):
        assert not spec_differences(site.spec, expected, ignore=("name", "source", "input_rank", "training")), site.name
    starts = [min(i for i, n in enumerate(exported.graph.node) if n.name in s.node_names) for s in sites]
    assert starts == sorted(starts)
    claimed = [n for s in sites for n in s.node_names]
    assert len(claimed) == len(set(claimed))


# -- normbridge's own decompositions --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, opset, dtype, eps",
    [
        ("layer", 15, "float32", 2e-5),
        ("layer", 16, "float16", 1e-3),
        ("rms", 18, "float32", 3e-3),
        ("rms", 22, "float64", 1e-4),
        ("group", 18, "float32", 1e-4),
    ],
)
def test_normbridge_decompositions(kind, opset, dtype, eps):
    spec = make_spec(kind, dtype=dtype, eps=eps, name=f"nb_{kind}", num_features=6, num_groups=3)
    model = converters.from_spec(spec, "onnx", opset=opset)
    sites = find_norm_sites(model)
    assert summary(sites) == [(kind, False, eps)]
    assert sites[0].origin == "normbridge" and sites[0].name == f"nb_{kind}"
    assert not spec_differences(sites[0].spec, spec, ignore=("source", "input_rank", "layout"))
    # without the metadata the spec is rebuilt from the graph alone: same function, same tensors
    del model.metadata_props[:]
    bare = find_norm_sites(model)[0].spec
    assert not spec_differences(
        bare, spec, ignore=("source", "input_rank", "layout", "momentum", "momentum_convention", "training")
    )


def chain(specs: list) -> onnx.ModelProto:
    """normbridge's one-layer models (opset 23) composed into one graph: native nodes inside a larger graph."""
    nodes, initializers, previous = [], [], "input"
    for position, spec in enumerate(specs):
        layer = converters.from_spec(spec, "onnx", opset=23)
        rename = {"X": previous, "Y": f"t{position}"}
        for node in layer.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [rename.get(n, n) for n in node.input]
            copy.output[:] = [rename.get(n, n) for n in node.output]
            nodes.append(copy)
        initializers.extend(layer.graph.initializer)
        previous = f"t{position}"
    dims = ["N", 4, 3, 5]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, dims)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_native_nodes_inside_a_graph_read_into_specs():
    specs = [
        make_spec(
            "batch", num_features=4, eps=2e-5, name="bn", momentum=0.1, nbt=None
        ),  # the counter lives in metadata only
        make_spec("instance", num_features=4, eps=1e-4, name="inorm", tracked=False),
        make_spec("group", num_features=4, num_groups=2, eps=3e-3, name="gn"),
        make_spec("layer", normalized_shape=(5,), eps=1e-4, name="ln"),
        make_spec("rms", normalized_shape=(3, 5), eps=2e-5, name="rms"),
    ]
    sites = find_norm_sites(chain(specs))
    assert [(s.kind, s.native, s.name, s.eps) for s in sites] == [(s.kind, True, s.name, s.eps) for s in specs]
    for site, spec in zip(sites, specs):
        assert not spec_differences(
            site.spec, spec, ignore=("source", "input_rank", "momentum", "momentum_convention", "variance_estimator")
        ), site.name
    assert batchnorm_folded_into_conv(chain(specs)) is False


def test_training_mode_batchnorm_is_reported():
    spec = make_spec("batch", num_features=4, eps=1e-3, training=True)
    model = converters.from_spec(spec, "onnx", opset=15, onnx_training_mode=True)
    (site,) = find_norm_sites(model)
    assert site.training_mode and site.native and site.eps == 1e-3


# -- precision: what must not be read as a normalization --------------------------------------------------


def _graph(nodes, constants: dict, rank: int = 3, opset: int = 13) -> onnx.ModelProto:
    dims = ["N", 3, 8][-rank:] if rank <= 3 else ["N", 4, 3, 8]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _layer_norm_nodes(variance_axes=(-1,), eps_inside=True, unbiased=False):
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var0"], axes=list(variance_axes)),
    ]
    nodes.append(
        helper.make_node("Mul", ["var0", "bessel"], ["var"])
        if unbiased
        else helper.make_node("Identity", ["var0"], ["var"])
    )
    if eps_inside:
        nodes += [helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"])]
    else:
        nodes += [helper.make_node("Sqrt", ["var"], ["s"]), helper.make_node("Add", ["s", "eps"], ["sd"])]
    nodes.append(helper.make_node("Div", ["d", "sd"], ["y"]))
    return nodes


CONSTANTS = {"eps": np.array(1e-5, np.float32), "bessel": np.array(8 / 7, np.float32)}


def test_hand_built_layer_norm_is_read():
    sites = find_norm_sites(_graph(_layer_norm_nodes(), CONSTANTS))
    assert summary(sites) == [("layer", False, 1e-5)]
    assert sites[0].spec.normalized_shape == (8,) and not sites[0].spec.scale


@pytest.mark.parametrize(
    "variant",
    [dict(variance_axes=(-2, -1)), dict(eps_inside=False), dict(unbiased=True)],
    ids=["variance_over_other_axes", "eps_outside_sqrt", "unbiased_variance"],
)
def test_near_misses_are_not_normalizations(variant):
    assert find_norm_sites(_graph(_layer_norm_nodes(**variant), CONSTANTS)) == []


def test_centring_alone_and_plain_affine_are_not_normalizations():
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Mul", ["d", "k"], ["m"], name="scale/mul"),
        helper.make_node("Add", ["m", "b"], ["y"], name="scale/add"),
    ]
    constants = {"k": np.arange(1, 9, dtype=np.float32), "b": np.ones(8, np.float32)}
    # a per-channel Mul and Add without TF's batchnorm scope is not claimed to be a folded BatchNorm
    assert find_norm_sites(_graph(nodes, constants)) == []


def test_statistics_over_the_batch_axis_are_not_a_layer_norm():
    nodes = _layer_norm_nodes()
    nodes[0] = helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0, 2])
    nodes[3] = helper.make_node("ReduceMean", ["d2"], ["var0"], axes=[0, 2])
    assert find_norm_sites(_graph(nodes, CONSTANTS)) == []


def test_rejects_non_models():
    from schemas import UnsupportedObjectError

    with pytest.raises(UnsupportedObjectError, match="expected an onnx.ModelProto"):
        find_norm_sites("model.onnx")
