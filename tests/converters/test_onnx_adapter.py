"""ONNX adapter: specs -> ONNX graphs run in onnxruntime against the NumPy reference, and back.

Every model here is built by the adapter (or by hand with onnx.helper) and run for real
in onnxruntime's CPU provider; the oracle is converters.reference.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters import reference
from converters.onnx_adapter import FRAMEWORK, KIND_ADAPTERS, load_onnx, save_onnx
from converters.onnx_adapter.metadata import KEY
from converters.options import ConversionOptions
from converters.equivalence import output_tolerances
from converters.probe import probe_input
from converters.adapters import AdapterRegistry
from schemas import (
    InputFileError,
    LayerReport,
    NormSpec,
    NotExpressibleError,
    SpecError,
    UnsupportedObjectError,
    spec_differences,
)
from schemas.floats import as_float32, shortest_float32_decimal
from schemas.kinds import KIND_INFO

from tests.cases import CASES as ALL_CASES
from tests.spec_factory import per_feature, spec_with

DTYPE_EPS = 1.1920928955078125e-07
EPSILONS = [(1e-3, "explicit"), (2e-5, "explicit"), (DTYPE_EPS, "dtype_eps")]
OPSETS = [23, 21, 17, 15]
RUNNING = dict(
    momentum=0.01, momentum_convention="batch_weight", track_running_stats=True, variance_estimator="unbiased"
)
NBT = {"num_batches_tracked": np.array(7, dtype=np.int64)}
#: The named cases the tests below single out (instance_tracked: a tracked InstanceNorm, written as BatchNormalization):
#: their kind and fields, swept over dtypes and eps; every kind's rows come from tests/cases.py (ROWS below).
ONNX_CASES = {
    "batch": ("batch", dict(name="batch", seed=1, **RUNNING, extra_tensors=NBT)),
    "instance_tracked": (
        "instance",
        dict(name="instance_tracked", spatial_rank=1, seed=1, **RUNNING, extra_tensors=NBT),
    ),
    "instance": ("instance", dict(name="inst", spatial_rank=1, seed=5)),
    "group": ("group", dict(name="gn", num_groups=3, seed=7)),
    "layer": ("layer", dict(name="ln", normalized_shape=(3, 4), seed=9)),
    "rms": ("rms", dict(name="rms", normalized_shape=(8,), bias=False, seed=11)),
}
CASES = list(ONNX_CASES)
#: Every row of tests/cases.py that ONNX holds as its own op (not refused, not only expressed): a new kind or setting
#: there runs through the ONNX adapter here at every opset, with no table of this file to extend.
ROWS = {case.id: case for case in ALL_CASES if not {"onnx"} & (case.refused_by | case.expressed_by)}


def native_opset(case: str) -> int:
    """The first opset at which the case is written as its native op (a tracked InstanceNorm is a
    BatchNormalization)."""
    return KIND_INFO["batch" if case == "instance_tracked" else ONNX_CASES[case][0]].onnx_opset


tensor = per_feature


def make_spec(
    case: str, dtype: str = "float32", eps: float = 1e-3, eps_origin: str = "explicit", **changes
) -> NormSpec:
    """The case's spec (tests/spec_factory.spec_with), with non-default eps and momentum 0.01 (batch_weight);
    `changes` win."""
    kind, fields = ONNX_CASES[case]
    fields = {**fields, "dtype": dtype, "eps": eps, "eps_origin": eps_origin, **changes}
    if "tensors" in changes:
        fields.pop("extra_tensors", None)
    return spec_with(kind, **fields)


def emit(spec: NormSpec, opset: int = 23, **options) -> tuple[onnx.ModelProto, LayerReport]:
    report = LayerReport(
        layer=spec.name, kind=spec.kind, source_framework="spec", target_framework="onnx", target_op="?"
    )
    model = KIND_ADAPTERS[spec.kind]().from_spec(spec, ConversionOptions(opset=opset, **options), report)
    return model, report


def read(model: onnx.ModelProto) -> tuple[NormSpec, LayerReport]:
    kind = FRAMEWORK.kind_of(model)
    report = LayerReport(layer="?", kind=kind, source_framework="onnx", target_framework="spec", target_op="NormSpec")
    return KIND_ADAPTERS[kind]().to_spec(model, report), report


def without_metadata(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.metadata_props[:]
    return copy


def assert_matches_reference(spec: NormSpec, model: onnx.ModelProto, training: bool | None = None) -> None:
    x = probe_input(spec)
    expected = reference.forward(spec, x, training)
    atol, rtol = output_tolerances(
        FRAMEWORK, spec, float(np.max(np.abs(expected)))
    )  # float64 layers run with float32(eps)
    np.testing.assert_allclose(FRAMEWORK.run_eval(model, x).astype(np.float64), expected, atol=atol, rtol=rtol)


def hand_model(node, inputs, initializers, opset, outputs=None):
    """A one-node model; Y defaults to X's type and shape."""
    if outputs is None:
        outputs = [onnx.ValueInfoProto()]
        outputs[0].CopyFrom(inputs[0])
        outputs[0].name = "Y"
    graph = helper.make_graph([node], "hand", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


# -- every row of tests/cases.py, every opset: ORT output, round trip, reading without metadata ---


def row_native_opset(spec: NormSpec) -> int:
    """The first opset at which the row is written as its native op: a tracked InstanceNorm as a BatchNormalization."""
    tracked_instance = spec.kind == "instance" and spec.track_running_stats
    return KIND_INFO["batch" if tracked_instance else spec.kind].onnx_opset


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("row", sorted(ROWS))
def test_every_case_row_at_every_opset(row, opset):
    case = ROWS[row]
    spec = case.spec
    untracked_instance = spec.kind == "instance" and not spec.track_running_stats
    group_decomposed = spec.kind == "group" and opset < row_native_opset(spec)
    if spec.dtype == "bfloat16" and opset < 22 and (untracked_instance or group_decomposed):
        # A GroupNorm decomposition and an InstanceNorm are InstanceNormalization-6, which has no bfloat16 before 22.
        with pytest.raises(NotExpressibleError, match=rf"setting 'dtype'.*opset {opset}\) takes no bfloat16.*opset 22"):
            emit(spec, opset)
        return
    model, report = emit(spec, opset)
    assert report.native == (opset >= row_native_opset(spec)), report.target_op
    if "onnx" not in case.no_runtime:
        assert_matches_reference(spec, model)
    back, _ = read(model)
    assert spec_differences(spec, back) == []
    assert back.eps == spec.eps and back.source.framework == "onnx"
    if report.native and len(model.graph.node) == 1:  # a channels-first LayerNorm's Transposes need the metadata
        bare, _ = read(without_metadata(model))
        tracked_instance = spec.kind == "instance" and spec.track_running_stats
        assert bare.name == spec.name and bare.kind == ("batch" if tracked_instance else spec.kind)
        if "scale" in spec.tensors:  # an absent scale is written as ones, which the graph alone cannot tell apart
            np.testing.assert_array_equal(bare.tensors["scale"], spec.tensors["scale"])


# -- the named cases, every opset, three eps: ORT output, round trip, reading without metadata ---


@pytest.mark.parametrize("eps,origin", EPSILONS)
@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("case", CASES)
def test_float32_round_trip_and_output(case, opset, eps, origin):
    spec = make_spec(case, eps=eps, eps_origin=origin)
    model, report = emit(spec, opset)
    assert report.native == (opset >= native_opset(case))
    assert_matches_reference(spec, model)

    back, _ = read(model)
    assert spec_differences(spec, back) == []
    assert back.eps == eps and back.eps_origin == origin
    assert back.source.framework == "onnx"

    if report.native:
        bare, _ = read(without_metadata(model))
        assert bare.eps == shortest_float32_decimal(as_float32(eps))
        assert bare.name == spec.name
        np.testing.assert_array_equal(bare.tensors["scale"], spec.tensors["scale"])
    else:
        with pytest.raises(UnsupportedObjectError, match="expected one normalization node"):
            read(without_metadata(model))


@pytest.mark.parametrize(
    "case,opset,op",
    [
        ("batch", 23, "BatchNormalization-15"),
        ("batch", 14, "BatchNormalization-14"),
        ("batch", 13, "BatchNormalization-9"),
        ("instance", 23, "InstanceNormalization-22"),
        ("instance_tracked", 23, "BatchNormalization-15"),
        ("layer", 17, "LayerNormalization-17"),
        ("group", 21, "GroupNormalization-21"),
        ("rms", 23, "RMSNormalization-23"),
        ("layer", 16, "decomposition(ReduceMean,Sub,Mul,ReduceMean,Add,Sqrt,Div,Mul,Add)"),
        ("rms", 22, "decomposition(Mul,ReduceMean,Add,Sqrt,Div,Mul)"),
        ("group", 20, "decomposition(Reshape,InstanceNormalization,Reshape,Mul,Add,Shape,Reshape)"),
    ],
)
def test_target_op_and_report(case, opset, op):
    spec = make_spec(case)
    model, report = emit(spec, opset)
    assert report.target_op == op
    assert [n.op_type for n in model.graph.node] == (
        op[len("decomposition(") : -1].split(",") if not report.native else [op.split("-")[0]]
    )
    fates = {t.setting: t.fate for t in report.translations}
    assert fates["scale"] == "exact" and fates["eps"] in ("exact", "stored")
    if "num_batches_tracked" in spec.tensors:
        assert fates["num_batches_tracked"] == "stored"
        assert fates["momentum"] == "translated"
    if not report.native:
        assert any("decomposition" in w for w in report.warnings)


@pytest.mark.parametrize("opset", [23, 15])
@pytest.mark.parametrize("case", CASES)
def test_float64(case, opset):
    spec = make_spec(case, dtype="float64", eps=2e-5)
    model, report = emit(spec, opset)
    uses_instance_norm = any(n.op_type == "InstanceNormalization" for n in model.graph.node)
    if uses_instance_norm:
        # onnxruntime 1.32 CPU has no float64 InstanceNormalization kernel: the adapter says so.
        assert any("float64" in w for w in report.warnings)
    else:
        assert_matches_reference(spec, model)
    back, _ = read(model)
    assert spec_differences(spec, back) == []
    if spec.track_running_stats:  # momentum 0.99 is not a float32: training steps cannot match to 1e-10
        assert any("momentum as float32" in w for w in report.warnings)


@pytest.mark.parametrize("opset", [23, 15])
@pytest.mark.parametrize("case", CASES)
def test_float16(case, opset):
    spec = make_spec(case, dtype="float16", eps=1e-3)
    model, _ = emit(spec, opset)
    assert_matches_reference(spec, model)
    back, _ = read(model)
    assert spec_differences(spec, back) == []


@pytest.mark.parametrize("opset", [23, 15])
@pytest.mark.parametrize("case", ["batch", "instance", "group", "layer", "rms"])
def test_absent_affine_round_trips(case, opset):
    tensors = dict(make_spec(case).tensors)
    tensors.pop("scale"), tensors.pop("bias", None)
    spec = make_spec(case, scale=False, bias=False, tensors=tensors)
    model, report = emit(spec, opset)
    assert_matches_reference(spec, model)
    back, _ = read(model)
    assert spec_differences(spec, back) == []
    if report.native and case != "layer":
        assert {t.setting: t.fate for t in report.translations}["scale"] == "stored"


# -- reading graphs normbridge did not write ---------------------------------------------------


def gn18_model(channels="C"):
    scale, bias = np.array([0.5, -1.25, 2.0], np.float32), np.array([0.1, 0.0, -0.3], np.float32)
    node = helper.make_node("GroupNormalization", ["X", "s", "b"], ["Y"], num_groups=3, epsilon=1e-3)
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 6 if channels == "C" else "C", "H", "W"])
    return (
        hand_model(node, [x], [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(bias, "b")], 18),
        scale,
        bias,
    )


def opset18_group_norm(x, scale, bias, groups, eps):
    """GroupNormalization-18: statistics per (sample, group), scale and bias per group."""
    grouped = x.astype(np.float64).reshape(x.shape[0], groups, -1)
    normalized = (grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + eps)
    return (normalized * scale[None, :, None] + bias[None, :, None]).reshape(x.shape)


def test_deprecated_group_norm_18_reads_per_channel(tmp_path):
    model, scale, bias = gn18_model()
    spec, report = read(model)
    assert (spec.kind, spec.num_features, spec.num_groups, spec.eps) == ("group", 6, 3, 1e-3)
    np.testing.assert_array_equal(spec.tensors["scale"], np.repeat(scale, 2))
    assert spec.source.layer_type == "GroupNormalization-18"
    assert any("deprecated GroupNormalization-18" in w for w in report.warnings)
    x = probe_input(spec)
    np.testing.assert_allclose(
        reference.forward(spec, x), opset18_group_norm(x, scale, bias, 3, 1e-3), rtol=1e-12, atol=1e-12
    )
    # load_onnx accepts the deprecated op the checker rejects, since normbridge can read it.
    path = tmp_path / "gn18.onnx"
    path.write_bytes(model.SerializeToString())
    assert read(load_onnx(path))[0] == spec


def test_deprecated_group_norm_18_needs_known_channels():
    model, _, _ = gn18_model(channels="symbolic")
    with pytest.raises(SpecError, match="channel count of X .* is unknown"):
        read(model)


def bn_inputs(dtype=np.float32):
    return [
        numpy_helper.from_array(tensor(3, dtype, seed, positive=seed == 4), name)
        for seed, name in enumerate("sbmv", start=1)
    ]


def test_hand_built_train_mode_batch_norm_reads_training():
    node = helper.make_node(
        "BatchNormalization", ["X", "s", "b", "m", "v"], ["Y", "rm", "rv"], epsilon=1e-5, training_mode=1
    )
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, "L"])
    outputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
        for n, s in (("Y", ["N", 3, "L"]), ("rm", [3]), ("rv", [3]))
    ]
    spec, _ = read(hand_model(node, [x], bn_inputs(), 15, outputs))
    assert spec.training and spec.track_running_stats
    assert (spec.eps, spec.momentum, spec.momentum_convention, spec.spatial_rank, spec.input_rank) == (
        1e-05,
        0.9,
        "running_weight",
        1,
        3,
    )


def test_state_tensor_as_graph_input_is_refused():
    node = helper.make_node("BatchNormalization", ["X", "s", "b", "m", "v"], ["Y"])
    inputs = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3]),
        helper.make_tensor_value_info("m", TensorProto.FLOAT, [3]),
    ]
    initializers = [t for t in bn_inputs() if t.name != "m"]
    with pytest.raises(
        SpecError, match="setting 'running_mean': the running_mean tensor 'm' of BatchNormalization is a graph input"
    ):
        read(hand_model(node, inputs, initializers, 15))


def test_other_graphs_are_refused_with_what_was_found():
    relu = helper.make_node("Relu", ["X"], ["R"])
    bn = helper.make_node("BatchNormalization", ["R", "s", "b", "m", "v"], ["Y"])
    graph = helper.make_graph(
        [relu, bn],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])],
        bn_inputs(),
    )
    with pytest.raises(
        UnsupportedObjectError, match=r"holds 2 nodes \(Relu, BatchNormalization\), expected one normalization node"
    ):
        FRAMEWORK.kind_of(helper.make_model(graph))
    with pytest.raises(UnsupportedObjectError, match="expected an onnx.ModelProto"):
        FRAMEWORK.kind_of(onnx.GraphProto())
    with pytest.raises(UnsupportedObjectError, match="holds a layer layer, expected a batch layer"):
        KIND_ADAPTERS["batch"]().to_spec(
            emit(make_spec("layer"))[0],
            LayerReport(layer="?", kind="batch", source_framework="onnx", target_framework="spec", target_op="?"),
        )


# -- metadata is trusted only where the graph agrees ---------------------------------------------


def set_attribute(model, name, value):
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(name, value)])


def test_metadata_disagreeing_with_graph_is_ignored_with_warning():
    spec = make_spec("batch", eps=1e-3)
    model, _ = emit(spec)
    set_attribute(model, "epsilon", 1e-4)
    set_attribute(model, "momentum", 0.5)
    back, report = read(model)
    assert back.eps == 1e-4 and (back.momentum, back.momentum_convention) == (0.5, "running_weight")
    assert any("metadata eps=0.001 disagrees" in w for w in report.warnings)
    assert any("metadata momentum=0.01" in w for w in report.warnings)


def test_absent_scale_is_trusted_only_if_the_tensor_is_ones():
    spec = make_spec("instance", scale=False, tensors={"bias": make_spec("instance").tensors["bias"]})
    model, _ = emit(spec)
    scale = next(t for t in model.graph.initializer if t.name == "inst.scale")
    scale.CopyFrom(numpy_helper.from_array(np.full(3, 2.0, np.float32), "inst.scale"))
    back, report = read(model)
    assert back.scale and np.all(back.tensors["scale"] == 2.0)
    assert any("metadata scale=False disagrees" in w for w in report.warnings)


def test_edited_decomposition_is_refused():
    model, _ = emit(make_spec("layer"), opset=15)
    set_attribute(model, "axes", [-1])  # the first ReduceMean now averages over the last axis only
    with pytest.raises(
        UnsupportedObjectError,
        match=r"differs from the decomposition normbridge emits for it \(node 0 \(ReduceMean\) has other",
    ):
        read(model)


def test_decomposition_eps_constant_is_exact_in_float64():
    spec = make_spec("rms", dtype="float64", eps=DTYPE_EPS, eps_origin="dtype_eps")
    model, _ = emit(spec, opset=21)
    constant = next(t for t in model.graph.initializer if t.name == "rms.epsilon")
    assert float(numpy_helper.to_array(constant)) == DTYPE_EPS
    assert read(model)[0].eps == DTYPE_EPS


def test_cumulative_momentum_next_step_reads_back_as_none():
    tensors = dict(make_spec("batch").tensors)
    spec = make_spec("batch", momentum=None, momentum_convention=None, tensors=tensors)
    with pytest.raises(NotExpressibleError, match="setting 'momentum'"):
        emit(spec)
    model, report = emit(spec, cumulative_momentum="next_step")
    assert {t.setting: t.fate for t in report.translations}["momentum"] == "approximate"
    back, _ = read(model)
    assert back.momentum is None and int(back.tensors["num_batches_tracked"]) == 7


# -- training ------------------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [23, 13])
def test_training_step_matches_reference(opset):
    spec = make_spec("batch")
    model, _ = emit(spec, opset)
    x = probe_input(spec)
    y, mean, var = FRAMEWORK.run_train_step(model, x)
    expected = reference.train_step(spec, x, "biased")
    for got, want in ((y, expected.output), (mean, expected.running_mean), (var, expected.running_var)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(
        FRAMEWORK.run_eval(model, x), reference.forward(spec, x), atol=1e-5, rtol=1e-4
    )  # model unchanged


def test_training_step_without_running_statistics_is_the_output():
    spec = make_spec("layer")
    model, _ = emit(spec)
    y, mean, var = FRAMEWORK.run_train_step(model, probe_input(spec))
    assert mean is None and var is None
    np.testing.assert_allclose(y, reference.forward(spec, probe_input(spec)), atol=1e-5, rtol=1e-4)


def test_training_step_of_tracked_instance_is_refused():
    model, report = emit(make_spec("instance_tracked"))
    assert any("training differs" in w for w in report.warnings)
    with pytest.raises(NotExpressibleError, match="layer 'instance_tracked', setting 'training'"):
        FRAMEWORK.run_train_step(model, probe_input(make_spec("instance_tracked")))


def test_train_mode_batch_norm_is_refused_unless_asked():
    spec = make_spec("batch", training=True)
    with pytest.raises(NotExpressibleError) as error:
        emit(spec)
    assert error.value.setting == "training" and error.value.target == "onnx"
    assert str(error.value).startswith(
        "layer 'batch', setting 'training': cannot convert to onnx: the layer is in training mode"
    )
    assert "each request's output depends on the others in its batch" in str(error.value)
    assert "onnx_training_mode=True" in str(error.value)

    model, report = emit(spec, onnx_training_mode=True)
    assert [o.name for o in model.graph.output] == ["Y", "running_mean", "running_var"]
    assert any("batch statistics" in w for w in report.warnings)
    assert_matches_reference(spec, model, training=True)
    back, _ = read(model)
    assert back.training and spec_differences(spec, back) == []


def test_train_mode_needs_batch_norm_14():
    with pytest.raises(NotExpressibleError, match="setting 'opset'.*pass opset >= 14"):
        emit(make_spec("batch", training=True), 13, onnx_training_mode=True)


def test_untracked_batch_norm_is_refused_unless_asked():
    spec = make_spec(
        "batch",
        track_running_stats=False,
        momentum=None,
        momentum_convention=None,
        variance_estimator=None,
        tensors={k: v for k, v in make_spec("batch").tensors.items() if k in ("scale", "bias")},
    )
    with pytest.raises(
        NotExpressibleError,
        match="layer 'batch', setting 'track_running_stats': cannot convert to onnx: .*pass onnx_training_mode=True",
    ):
        emit(spec)
    model, report = emit(spec, onnx_training_mode=True)
    assert any("training_mode=1" in w for w in report.warnings)
    assert_matches_reference(spec, model)
    back, _ = read(model)
    assert spec_differences(spec, back) == []


def test_tracked_instance_in_training_mode():
    spec = make_spec("instance_tracked", training=True)
    with pytest.raises(NotExpressibleError, match="layer 'instance_tracked', setting 'training'"):
        emit(spec)
    model, report = emit(spec, onnx_training_mode=True)
    assert [n.op_type for n in model.graph.node] == ["InstanceNormalization"]
    assert any("running statistics are neither carried nor updated" in w for w in report.warnings)
    assert {t.setting: t.fate for t in report.translations}["running_mean"] == "dropped"
    assert_matches_reference(spec, model)
    back, _ = read(model)
    assert not back.track_running_stats and back.training


# -- files and registry --------------------------------------------------------------------------


def test_save_and_load_round_trip(tmp_path):
    spec = make_spec("group", eps=2e-5)
    model, _ = emit(spec, opset=17)
    path = save_onnx(model, tmp_path / "gn.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["gn.onnx"]
    loaded = load_onnx(path)
    assert any(p.key == KEY for p in loaded.metadata_props)
    assert spec_differences(spec, read(loaded)[0]) == []


def test_load_onnx_errors(tmp_path):
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\xff\xff\xff\xff not a protobuf")
    with pytest.raises(InputFileError, match=r"'.*corrupt.onnx' is not an ONNX model \(protobuf decoding failed"):
        load_onnx(corrupt)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(emit(make_spec("layer"))[0].SerializeToString()[:-40])
    with pytest.raises(InputFileError, match="truncated.onnx"):
        load_onnx(truncated)
    with pytest.raises(InputFileError, match=r"cannot read ONNX file '.*missing.onnx' \(No such file"):
        load_onnx(tmp_path / "missing.onnx")


def test_registry_finds_every_kind():
    registry = AdapterRegistry()
    for case in CASES:
        model, _ = emit(make_spec(case))
        framework = registry.framework_of(model)
        assert framework.name == "onnx" and framework.natural_layout() == "channels_first"
        assert registry.get("onnx", framework.kind_of(model)).kind == make_spec(case).kind


def test_opset_beyond_onnx_is_refused():
    with pytest.raises(
        NotExpressibleError, match=f"layer 'ln', setting 'opset': .*opset {onnx.defs.onnx_opset_version() + 1} is newer"
    ):
        emit(make_spec("layer"), onnx.defs.onnx_opset_version() + 1)


def test_op_missing_from_the_models_opset_is_refused():
    node = helper.make_node("LayerNormalization", ["X", "s"], ["Y"])
    model = hand_model(
        node,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "s")],
        16,
    )
    with pytest.raises(UnsupportedObjectError, match="LayerNormalization does not exist at opset 16"):
        read(model)


def test_unreadable_metadata_is_ignored_with_a_warning():
    model, _ = emit(make_spec("layer", eps=2e-5))
    model.metadata_props[0].value = "{not json"
    back, report = read(model)
    assert back.eps == 2e-5 and back.name == "ln"  # the node keeps the layer name
    assert any("is not a JSON object" in w for w in report.warnings)


def test_a_model_is_parsed_once_while_its_caller_holds_it_unchanged_and_refused_as_ever():
    import converters
    from converters.onnx_adapter.reading import models_unchanged, parse

    model = converters.from_spec(make_spec("batch"), "onnx")
    assert parse(model) is not parse(model)  # outside the block every parse reads the model
    with FRAMEWORK.unchanged_objects():
        layer = parse(model)
        assert parse(model, "batch") is layer and FRAMEWORK.kind_of(model) == "batch"
        assert layer.initializers and not any(
            array.flags.writeable for array in layer.initializers.values()
        )  # no reader changes them
        with pytest.raises(UnsupportedObjectError, match="holds a batch layer, expected a layer layer"):
            parse(model, "layer")
        other = onnx.ModelProto()
        other.CopyFrom(model)
        assert parse(other) is not layer  # another object is parsed on its own
    with models_unchanged():
        assert parse(model) is not layer  # a new block parses afresh


def test_every_kind_the_onnx_adapter_converts_runs_here():
    """A kind the ONNX adapter takes has rows in tests/cases.py (tests/converters/test_coverage.py requires them), and
    test_every_case_row_at_every_opset runs each one ONNX holds: a new kind is one row there, nothing here."""
    assert set(KIND_ADAPTERS) <= {case.spec.kind for case in ROWS.values()}
