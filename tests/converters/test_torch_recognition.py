"""Normalizations found by what they compute: one row per family real models use, each failing if the family were
missed or misread (count, kind, eps, axes, scale offset, compute dtype, frozen), checked against the NumPy reference."""

from __future__ import annotations

import json
import importlib
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch
from torch import nn

import converters
from converters.models.inspection import inspect_model, inspect_path
from converters.torch_adapter.recognition import norm_proof
from converters.torch_adapter.recognition.computed import prove, recognition
from converters.torch_adapter.recognition.derived_spec import to_torch
from schemas import DuplicateAdapterError, UnsupportedObjectError

from tests import real_norms as R
from tests.cli_run import invoke_cli


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], nn.Module]
    module: str  # where the class lives in transformers
    kind: str
    eps: float | Callable[[nn.Module], float]
    scale_offset: float = 0.0
    frozen: bool = False
    layout: Callable[[nn.Module], str | None] = lambda m: None

    def eps_of(self, module: nn.Module) -> float:
        return self.eps(module) if callable(self.eps) else self.eps

    def cls(self) -> type:
        return getattr(importlib.import_module(self.module), self.name)


TF = "transformers.models"
FAMILIES = [
    Family("LlamaRMSNorm", R.llama, f"{TF}.llama.modeling_llama", "rms", 3e-6),
    Family("Qwen2RMSNorm", R.qwen2, f"{TF}.qwen2.modeling_qwen2", "rms", 2e-6),
    Family("Qwen3RMSNorm", R.qwen3, f"{TF}.qwen3.modeling_qwen3", "rms", 2.5e-6),
    Family("MambaRMSNorm", R.mamba, f"{TF}.mamba.modeling_mamba", "rms", 6e-6),
    Family("MistralRMSNorm", R.mistral, f"{TF}.mistral.modeling_mistral", "rms", 4e-6),
    Family("GemmaRMSNorm", R.gemma, f"{TF}.gemma.modeling_gemma", "rms", 5e-6, scale_offset=1.0),
    Family("T5LayerNorm", R.t5, f"{TF}.t5.modeling_t5", "rms", 7e-6),
    Family(
        "ConvNextLayerNorm",
        R.convnext,
        f"{TF}.convnext.modeling_convnext",
        "layer",
        3e-6,
        layout=lambda m: "channels_first" if m.data_format == "channels_first" else None,
    ),
    Family(
        "ConvNextV2LayerNorm",
        R.convnextv2,
        f"{TF}.convnextv2.modeling_convnextv2",
        "layer",
        3e-6,
        layout=lambda m: "channels_first" if m.data_format == "channels_first" else None,
    ),
    Family("DetrFrozenBatchNorm2d", R.detr, f"{TF}.detr.modeling_detr", "batch", 1e-5, frozen=True),
]


def probe_for(spec) -> np.ndarray:
    """A probe (seed 1, not the proof's) whose odd samples make eps matter, channels-first for the channel kinds."""
    c = spec.num_features or spec.normalized_shape[0]
    shape = (4, c, 3, 5) if spec.kind == "batch" or spec.layout == "channels_first" else (4, 3, c)
    return norm_proof.as_dtype(norm_proof.probe_input(shape, spec.eps, seed=1), spec.dtype)


def assert_computes(module: nn.Module, spec, rtol: float = 2e-5) -> None:
    """The module's eval output equals the NumPy reference for its spec."""
    x = probe_for(spec)
    with torch.no_grad():
        y = module.eval()(to_torch(x, module_dtype(module))).to(torch.float64).numpy()
    want = norm_proof.expected(spec, x)
    np.testing.assert_allclose(y, want, rtol=rtol, atol=rtol * max(1.0, float(np.abs(want).max())))


def module_dtype(module: nn.Module) -> torch.dtype:
    return next(t for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point()).dtype


def codes(inspection) -> list[str]:
    return [hazard.code for _, hazard in inspection.all_hazards()]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def family_model(request):
    family = request.param
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = R.randomise(family.build())
    return family, model


def test_inspect_finds_every_module_of_the_family_and_reads_it_exactly(family_model):
    family, model = family_model
    present = {path: m for path, m in model.named_modules() if type(m) is family.cls()}
    assert present, f"the {family.name} model has none of its norms: the test builds the wrong model"
    inspection = inspect_model(model)
    found = {layer.path: layer for layer in inspection.layers if layer.layer_type == family.name}
    assert set(found) == set(present)
    assert "unrecognised_normalization" not in codes(inspection)
    for path, module in present.items():
        spec = converters.to_spec(module)
        eps = family.eps_of(module)
        assert (spec.kind, spec.eps, spec.scale_offset, spec.frozen, spec.compute_dtype) == (
            family.kind,
            eps,
            family.scale_offset,
            family.frozen,
            None,
        )
        assert spec.layout == (family.layout(module) if family.kind != "batch" else "channels_first")
        assert found[path].spec["eps"] == eps and found[path].kind == family.kind
        assert_computes(module, spec)


@pytest.mark.parametrize(
    "build, cast_before_affine, scale_offset",
    [
        (lambda: __import__(f"{TF}.llama.modeling_llama", fromlist=["x"]).LlamaRMSNorm(16, eps=1e-5), True, 0.0),
        (lambda: __import__(f"{TF}.gemma.modeling_gemma", fromlist=["x"]).GemmaRMSNorm(16, eps=1e-5), False, 1.0),
        (lambda: __import__(f"{TF}.t5.modeling_t5", fromlist=["x"]).T5LayerNorm(16, eps=1e-5), True, 0.0),
    ],
    ids=["LlamaRMSNorm", "GemmaRMSNorm", "T5LayerNorm"],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_narrow_layer_that_upcasts_records_its_compute_dtype_and_where_it_casts_back(
    build, cast_before_affine, scale_offset, dtype
):
    module = R.randomise(build()).to(dtype)
    spec = converters.to_spec(module)
    assert (spec.dtype, spec.compute_dtype, spec.cast_before_affine, spec.scale_offset) == (
        str(dtype).removeprefix("torch."),
        "float32",
        cast_before_affine,
        scale_offset,
    )
    assert_computes(module, spec, rtol=norm_proof.TOLERANCE[spec.dtype])


SyncBN = lambda: nn.SyncBatchNorm(8, eps=2e-5)  # noqa: E731
REPLICAS = [
    # (builder, kind, eps, layout, frozen, hazard the model must show)
    (lambda: R.FrozenBatchNorm2d(8, eps=3e-5), "batch", 3e-5, "channels_first", True, None),
    (lambda: R.LayerNorm2d(8, eps=4e-6), "layer", 4e-6, "channels_first", False, None),
    (lambda: R.RmsNorm(8, eps=2e-6), "rms", 2e-6, None, False, None),
    (lambda: R.FunctionalLayerNorm(8, eps=1e-4), "layer", 1e-4, None, False, None),
    (lambda: R.WrittenOutLayerNorm(8, eps=6e-6), "layer", 6e-6, None, False, None),
    (lambda: R.ChannelsFirstLayerNorm(8, eps=5e-6), "layer", 5e-6, "channels_first", False, None),
    (SyncBN, "batch", 2e-5, "channels_first", False, "per_device_statistics"),
    (lambda: R.BatchNormAct2d(8, eps=7e-5), "batch", 7e-5, "channels_first", False, "computes_more"),
]


@pytest.mark.parametrize(
    "build, kind, eps, layout, frozen, hazard",
    REPLICAS,
    ids=[
        "FrozenBatchNorm2d",
        "LayerNorm2d",
        "RmsNorm",
        "F.layer_norm",
        "written-out",
        "ConvNeXt-repo-channels-first",
        "SyncBatchNorm",
        "BatchNormAct2d",
    ],
)
def test_replicas_of_torchvision_and_timm_classes_are_read_exactly(build, kind, eps, layout, frozen, hazard):
    norm = R.randomise(build())
    model = nn.Sequential(nn.Identity(), norm)
    inspection = inspect_model(model)
    assert [(layer.path, layer.kind, layer.layer_type) for layer in inspection.layers] == [
        ("1", kind, type(norm).__name__)
    ]
    spec = converters.to_spec(norm)
    assert (spec.kind, spec.eps, spec.layout, spec.frozen) == (kind, eps, layout, frozen)
    assert "unrecognised_normalization" not in codes(inspection)
    if hazard is not None:
        assert hazard in codes(inspection)
    if hazard != "computes_more":  # BatchNormAct2d adds a ReLU: only its BatchNorm part is the spec
        assert_computes(norm, spec)


@pytest.mark.parametrize("near_miss", [R.EpsOutsideNorm, R.UnbiasedLayerNorm, R.PowNorm])
def test_a_module_that_looks_like_a_norm_but_is_not_proved_is_named_never_skipped(near_miss):
    model = nn.Sequential(nn.Linear(8, 8), R.randomise(near_miss(8)))
    inspection = inspect_model(model)
    assert inspection.layers == []
    [message] = [h.message for _, h in inspection.all_hazards() if h.code == "unrecognised_normalization"]
    assert message.startswith(f"'1' ({near_miss.__name__})")
    found = recognition(model[1])
    assert found.spec is None
    with pytest.raises(UnsupportedObjectError) as refused:  # converting it alone says why, as inspect does
        converters.to_spec(model[1])
    assert found.reason in str(refused.value) and "converters.recognize" in str(refused.value)


def test_a_misread_eps_fails_the_proof():
    module = R.randomise(importlib.import_module(f"{TF}.llama.modeling_llama").LlamaRMSNorm(16, eps=1e-5))
    spec = converters.to_spec(module)
    assert prove(module, spec, (4, 3, 16)) is None
    assert "differs from the reference" in prove(module, spec.replace(eps=1e-4), (4, 3, 16))
    assert "differs from the reference" in prove(module, spec.replace(eps=1e-6), (4, 3, 16))


def test_a_declared_class_is_proved_per_instance_and_a_wrong_declaration_is_refused():
    try:
        converters.recognize(R.PowNorm, kind="rms", eps="tiny", weight="gain")
        with pytest.raises(DuplicateAdapterError):
            converters.recognize(R.PowNorm, kind="rms", eps="tiny", weight="gain")
        norm = R.randomise(R.PowNorm(8, tiny=3e-5))
        spec = converters.to_spec(norm)
        assert (spec.kind, spec.eps, spec.source.layer_type) == ("rms", 3e-5, "PowNorm")
        assert_computes(norm, spec)
        converters.recognizers.declared.forget(R.PowNorm)
        converters.recognize(R.PowNorm, kind="layer", eps="tiny", weight="gain")
        inspection = inspect_model(nn.Sequential(R.randomise(R.PowNorm(8))))
        [message] = [h.message for _, h in inspection.all_hazards() if h.code == "unrecognised_normalization"]
        assert "its declaration does not hold" in message
    finally:
        converters.recognizers.declared.forget(R.PowNorm)


def test_declaring_or_forgetting_a_class_changes_the_verdict_of_an_instance_read_before():
    """The verdict is cached per instance while its state is unchanged; a declaration made (or forgotten) after a first
    reading is part of what it depends on, so the same instance is read again."""
    norm = R.randomise(R.PowNorm(8, tiny=3e-5))
    assert recognition(norm).spec is None
    try:
        converters.recognize(R.PowNorm, kind="rms", eps="tiny", weight="gain")
        assert recognition(norm).spec is not None and recognition(norm).how == "declared"
        assert_computes(norm, converters.to_spec(norm))
    finally:
        converters.recognizers.declared.forget(R.PowNorm)
    assert recognition(norm).spec is None


def test_a_recognised_spec_converts_to_the_stock_class_where_the_adapters_hold_it():
    llama = R.randomise(importlib.import_module(f"{TF}.llama.modeling_llama").LlamaRMSNorm(16, eps=1e-5))
    spec = converters.to_spec(llama)
    stock = converters.from_spec(spec, "torch", restore_source_class=False)
    assert isinstance(stock, nn.RMSNorm) and stock.eps == 1e-5
    assert_computes(stock, spec)
    gemma = importlib.import_module(f"{TF}.gemma.modeling_gemma").GemmaRMSNorm(16)
    for module, stock_class in [
        (gemma, nn.RMSNorm),
        (R.FrozenBatchNorm2d(8), nn.BatchNorm2d),
    ]:  # scale offset folded; frozen held
        spec = converters.to_spec(R.randomise(module))
        converted = converters.from_spec(spec, "torch", restore_source_class=False)
        assert isinstance(converted, stock_class)
        assert_computes(converted, spec)
    spec = converters.to_spec(R.randomise(R.LayerNorm2d(8)))
    stock = converters.from_spec(
        spec, "torch", restore_source_class=False
    )  # normbridge's own class for axis 1 (issue 34 item 10)
    assert type(stock).__name__ == "ChannelsFirstLayerNorm"
    assert_computes(stock, spec)
    restored = converters.from_spec(spec, "torch")  # its own class (imported here) is rebuilt by default
    assert type(restored) is R.LayerNorm2d
    assert_computes(restored, spec)


def test_a_convnext_style_class_of_transformers_is_rebuilt_with_its_data_format_even_when_not_imported(tmp_path):
    """ConvNextV2LayerNorm (channels_first) was not rebuilt: its module was not imported and only classes listed by name
    were (the message said so of a transformers.models.* module), and an imported one got `cls(size, eps=)`,
    channels_last; with no stock torch class for axis 1, every ConvNeXtV2 failed its registration check."""
    import subprocess
    import sys

    from schemas import save_spec

    module = importlib.import_module(f"{TF}.convnextv2.modeling_convnextv2")
    spec = converters.to_spec(R.randomise(module.ConvNextV2LayerNorm(8, eps=1e-6, data_format="channels_first")))
    assert spec.layout == "channels_first"
    restored = converters.from_spec(spec, "torch")
    assert type(restored) is module.ConvNextV2LayerNorm and restored.data_format == "channels_first"
    assert_computes(restored, spec)
    folder = save_spec(spec, tmp_path / "spec")
    script = (
        f"import sys, converters; from schemas import load_spec; name = '{TF}.convnextv2.modeling_convnextv2'; "
        f"assert name not in sys.modules; m = converters.from_spec(load_spec({str(folder)!r}), 'torch'); "
        "print(type(m).__module__, type(m).__name__, m.data_format)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [f"{TF}.convnextv2.modeling_convnextv2", "ConvNextV2LayerNorm", "channels_first"]


# -- .pt2 programs -------------------------------------------------------------------------------


def _export(family: Family, model: nn.Module):
    """(program, the module it was exported from): T5's encoder alone, which needs no decoder inputs."""
    if family.name == "T5LayerNorm":
        return torch.export.export(
            model.encoder, (torch.randint(0, 64, (1, 5)),), kwargs={"use_cache": False}
        ), model.encoder
    if family.kind == "rms":
        return torch.export.export(model, (torch.randint(0, 64, (1, 5)),), kwargs={"use_cache": False}), model
    size = 32 if family.name.startswith("ConvNext") else 64
    return torch.export.export(model, (torch.randn(1, 3, size, size),)), model


@pytest.mark.slow
def test_a_saved_program_lists_the_family_with_the_same_specs_as_the_module(family_model, tmp_path):
    family, model = family_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program, model = _export(family, model)
    torch.export.save(program, tmp_path / "model.pt2")
    inspection = inspect_path(tmp_path / "model.pt2")
    found = {layer.path: layer for layer in inspection.layers if layer.layer_type == family.name}
    present = {path: m for path, m in model.named_modules() if type(m) is family.cls()}
    assert set(found) == set(present)
    assert "unrecognised_normalization" not in codes(inspection)
    for path, layer in found.items():
        module_spec = converters.to_spec(present[path])
        assert (
            layer.kind,
            layer.spec["eps"],
            layer.spec["scale_offset"],
            layer.spec["frozen"],
            layer.spec["layout"],
        ) == (module_spec.kind, module_spec.eps, module_spec.scale_offset, module_spec.frozen, module_spec.layout)


def test_a_program_names_a_module_it_cannot_prove():
    model = nn.Sequential(nn.Linear(8, 8), R.randomise(R.EpsOutsideNorm(8)), R.randomise(R.RmsNorm(8, eps=2e-6)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model.eval(), (torch.randn(2, 3, 8),))
    inspection = inspect_model(program)
    assert [(layer.path, layer.kind) for layer in inspection.layers] == [("2", "rms")]
    [message] = [h.message for _, h in inspection.all_hazards() if h.code == "unrecognised_normalization"]
    assert message.startswith("'1' (EpsOutsideNorm)")


@pytest.mark.slow
def test_rt_detr_s_frozen_batchnorms_are_found_beside_its_stock_ones():
    from transformers import RTDetrConfig, RTDetrModel, RTDetrResNetConfig

    backbone = RTDetrResNetConfig(
        embedding_size=8,
        hidden_sizes=[8, 16, 16, 16],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    config = RTDetrConfig(
        backbone_config=backbone,
        use_pretrained_backbone=False,
        use_timm_backbone=False,
        d_model=32,
        encoder_hidden_dim=32,
        encoder_in_channels=[16, 16, 16],
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=5,
        decoder_layers=1,
        encoder_layers=1,
        decoder_in_channels=[32, 32, 32],
        num_feature_levels=3,
        decoder_attention_heads=2,
        encoder_attention_heads=2,
        num_denoising=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = R.randomise(RTDetrModel(config))
    frozen = {path for path, m in model.named_modules() if type(m).__name__ == "RTDetrFrozenBatchNorm2d"}
    inspection = inspect_model(model)
    found = {layer.path for layer in inspection.layers if layer.layer_type == "RTDetrFrozenBatchNorm2d"}
    assert frozen and found == frozen and "unrecognised_normalization" not in codes(inspection)
    assert all(layer.spec["frozen"] for layer in inspection.layers if layer.path in frozen)
    assert len(inspection.layers) == sum(isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)) for m in model.modules()) + len(
        frozen
    )


@pytest.mark.slow
@pytest.mark.parametrize("build", [R.llama, R.gemma], ids=["Llama", "Gemma"])
def test_export_verifies_every_hand_written_norm_it_rewrites_one_count_with_inspect(build, tmp_path):
    from converters.models.serving.export import export_for_serving

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = R.randomise(build())
        model.config.use_cache = False
        torch.export.save(torch.export.export(model, (torch.randint(0, 64, (1, 5)),)), tmp_path / "m.pt2")
        result = export_for_serving(tmp_path / "m.pt2", tmp_path / "m.onnx")
    inspected = {layer.path for layer in inspect_path(tmp_path / "m.pt2").layers}
    verified = {entry.source_layer for entry in result.verification}
    assert result.written and verified == inspected and len(inspected) == 5
    assert all(entry.passed for entry in result.verification)


def _saved(model: nn.Module, example: tuple, path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(model, example), path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "build,example",
    [
        (R.llama, lambda: (torch.randint(0, 64, (1, 5)),)),
        (R.detr, lambda: (torch.randn(1, 3, 64, 64, dtype=torch.bfloat16),)),
    ],
    ids=["Llama-bf16", "DETR-bf16"],
)
def test_a_bfloat16_export_verifies_every_norm_and_says_the_contract_was_not_run(build, example, tmp_path):
    """onnxruntime's CPU provider has no bfloat16 kernels: the contract cannot run. The export says so (what, why, how
    to get it checked), still verifies every normalization site from the graph, writes nothing unless --force,
    and no traceback."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = R.randomise(build()).to(torch.bfloat16)
    if hasattr(model, "config"):
        model.config.use_cache = False
    _saved(model, example(), tmp_path / "m.pt2")
    inspected = {layer.path for layer in inspect_path(tmp_path / "m.pt2").layers}
    refused = invoke_cli("export", "m.pt2", "--to", "onnx", "-o", "m.onnx", "--json", cwd=tmp_path)
    assert refused.returncode == 7 and not (tmp_path / "m.onnx").exists() and "Traceback" not in refused.stderr
    result = json.loads(refused.stdout)
    assert result["contract"] is None and not result["passed"]
    [error] = result["errors"]
    assert (
        error.startswith("not checked:")
        and "bfloat16" in error
        and "serving contract was not run" in error
        and "--force" in error
    )
    assert {entry["source_layer"] for entry in result["verification"]} == inspected and inspected
    assert all(entry["passed"] for entry in result["verification"])  # every norm verified from the graph alone
    forced = invoke_cli("export", "m.pt2", "--to", "onnx", "-o", "m.onnx", "--force", cwd=tmp_path)
    assert forced.returncode == 0 and (tmp_path / "m.onnx").exists() and "forced" in forced.stdout + forced.stderr
    contract = invoke_cli(
        "contract", "m.pt2", "m.onnx", cwd=tmp_path
    )  # it has no --force: the message must not offer one
    said = " ".join((contract.stdout + contract.stderr).split())
    assert contract.returncode == 6 and "float32 copy" in said and "`normbridge contract` cannot run it" in said, said


@pytest.mark.slow
def test_t5_s_exporter_failure_is_named_with_its_cause_and_nothing_is_written(tmp_path):
    """torch.onnx 2.13 fails to decompose T5's attention reshape: the message says which step, the cause and the code
    line, that nothing was written and no normalization checked in ONNX, and what checks them instead;
    no colour codes, no traceback."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = R.randomise(R.t5())
    _saved(model.encoder, (torch.randint(0, 64, (1, 5)),), tmp_path / "t5.pt2")
    refused = invoke_cli("export", "t5.pt2", "--to", "onnx", "-o", "t5.onnx", cwd=tmp_path)
    assert refused.returncode == 5 and not (tmp_path / "t5.onnx").exists()
    message = " ".join((refused.stdout + refused.stderr).split())
    assert "Traceback" not in message and "\x1b[" not in message
    assert "torch.onnx.export failed" in message and "decomposing the graph" in message and "modeling_t5.py" in message
    assert (
        "nothing was written and no normalization was checked in ONNX" in message and "normbridge register" in message
    )


def test_a_program_of_channel_norm_replicas_reads_each_like_its_module():
    norms = [
        R.BatchNormAct2d(8, eps=7e-5),
        R.FrozenBatchNorm2d(8, eps=3e-5),
        R.LayerNorm2d(8, eps=4e-6),
        R.ChannelsFirstLayerNorm(8, eps=5e-6),
        nn.SyncBatchNorm(8, eps=2e-5),
    ]
    model = R.randomise(nn.Sequential(*norms))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (torch.randn(2, 8, 3, 5),))
    inspection = inspect_model(program)
    read = [
        (layer.path, layer.kind, layer.spec["eps"], layer.spec["layout"], layer.spec["frozen"])
        for layer in inspection.layers
    ]
    assert read == [
        ("0", "batch", 7e-5, "channels_first", False),
        ("1", "batch", 3e-5, "channels_first", True),
        ("2", "layer", 4e-6, "channels_first", False),
        ("3", "layer", 5e-6, "channels_first", False),
        ("4", "batch", 2e-5, "channels_first", False),
    ]
    assert [h.message.split(" ")[0] for _, h in inspection.all_hazards() if h.code == "computes_more"] == ["'0'"]
    assert [h.message.split(" ")[0] for _, h in inspection.all_hazards() if h.code == "per_device_statistics"] == [
        "'4'"
    ]
    assert "unrecognised_normalization" not in codes(inspection)


def test_a_class_named_for_having_no_norm_is_not_a_candidate_in_wav2vec2s_feature_encoder():
    """transformers' wav2vec2 with feat_extract_norm="group" (wav2vec2-base's default): its first conv layer holds a
    GroupNorm, the later ones are Wav2Vec2NoLayerNormConvLayer (a Conv1d and a GELU). Only the GroupNorm is listed and
    nothing is unrecognised (the class name's 'Norm' made those a candidate that failed its proof, refusing
    registration)."""
    from transformers import Wav2Vec2Config
    from transformers.models.wav2vec2.modeling_wav2vec2 import Wav2Vec2FeatureEncoder

    config = Wav2Vec2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        conv_dim=(8, 8, 8),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        feat_extract_norm="group",
    )
    encoder = R.randomise(Wav2Vec2FeatureEncoder(config)).eval()
    assert [type(m).__name__ for m in encoder.conv_layers][1:] == ["Wav2Vec2NoLayerNormConvLayer"] * 2
    for model in (encoder, torch.export.export(encoder, (torch.randn(1, 400),))):
        inspection = inspect_model(model)
        assert [(layer.path, layer.kind) for layer in inspection.layers] == [("conv_layers.0.layer_norm", "group")]
        assert "unrecognised_normalization" not in codes(inspection)


def test_weight_norm_and_spectral_norm_parametrizations_are_not_candidates():
    """torch.nn.utils.parametrizations.weight_norm (wav2vec2's and HuBERT's pos_conv_embed) holds a `_WeightNorm`
    module: it rescales a weight, not an activation, and was reported unrecognised,
    refusing every wav2vec2 registration."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.utils.parametrizations.weight_norm(nn.Conv1d(16, 16, 3, padding=1), dim=2)
            self.head = torch.nn.utils.parametrizations.spectral_norm(nn.Linear(16, 16))
            self.ln = nn.LayerNorm(16)

        def forward(self, x):
            return self.head(self.ln(self.conv(x).transpose(1, 2)))

    block = R.randomise(Block()).eval()
    assert {type(m).__name__ for m in block.modules()} >= {"_WeightNorm", "_SpectralNorm"}
    for model in (block, torch.export.export(block, (torch.randn(1, 16, 10),))):
        inspection = inspect_model(model)
        assert [(layer.path, layer.kind) for layer in inspection.layers] == [("ln", "layer")]
        assert "unrecognised_normalization" not in codes(inspection)

    from transformers import Wav2Vec2Config
    from transformers.models.wav2vec2.modeling_wav2vec2 import Wav2Vec2Encoder

    config = Wav2Vec2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    encoder = R.randomise(Wav2Vec2Encoder(config)).eval()  # its pos_conv_embed holds a _WeightNorm
    assert any(type(m).__name__ == "_WeightNorm" for m in encoder.modules())
    norms = sorted(path for path, m in encoder.named_modules() if isinstance(m, nn.LayerNorm))
    for model in (encoder, torch.export.export(encoder, (torch.randn(1, 20, 32),))):
        inspection = inspect_model(model)
        assert sorted(layer.path for layer in inspection.layers) == norms and "unrecognised_normalization" not in codes(
            inspection
        )


def test_a_proved_norm_whose_forward_takes_a_gate_says_it_computes_more_and_the_program_says_unrecognised():
    """transformers' MambaRMSNormGated(hidden, gate) normalizes hidden * silu(gate). Called alone it is an RMSNorm,
    which the module's proof shows; the module cannot say whether the model passes the gate, so it warns; the .pt2 can,
    and the gated call it holds is not a normalization any recognizer proves."""
    from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 32)
            self.norm = MambaRMSNormGated(16, group_size=16, eps=1e-5)

        def forward(self, x):
            hidden, gate = self.proj(x).chunk(2, dim=-1)
            return self.norm(hidden, gate)

    block = R.randomise(Block()).eval()
    inspection = inspect_model(block)
    assert [(layer.path, layer.kind) for layer in inspection.layers] == [("norm", "rms")]
    [warning] = [h for _, h in inspection.all_hazards() if h.code == "computes_more"]
    assert warning.layer == "norm" and "also takes gate" in warning.message and warning.severity == "warning"
    program = torch.export.export(block, (torch.randn(2, 3, 16),))
    assert "unrecognised_normalization" in codes(inspect_model(program))


def test_olmos_layer_norm_without_weight_or_bias_is_sized_by_its_normalized_shape_and_read_as_a_layer_norm():
    """transformers' OlmoLayerNorm is F.layer_norm with no weight or bias: with no tensor to size a probe it was refused
    as unrecognised (no OLMo could register). Its own `normalized_shape` sizes the probe now;
    the proof decides as before."""
    from transformers import OlmoConfig, OlmoModel

    config = OlmoConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = R.randomise(OlmoModel(config)).eval()
    norms = [path for path, m in model.named_modules() if type(m).__name__ == "OlmoLayerNorm"]
    ids = torch.randint(0, 64, (1, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (ids,), kwargs={"use_cache": False})
    for source in (model, program):
        inspection = inspect_model(source)
        assert "unrecognised_normalization" not in codes(inspection)
        found = {layer.path: layer for layer in inspection.layers}
        assert set(norms) <= set(found) and len(norms) == 3
        assert all(found[p].kind == "layer" and found[p].eps == 1e-5 and not found[p].spec["scale"] for p in norms)
    x = torch.randn(2, 3, 16)
    layer = converters.from_spec(converters.to_spec(model.norm), "torch")
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(layer(x), (x - mean) / torch.sqrt(var + 1e-5))


def test_a_declared_class_without_tensors_is_sized_by_its_normalized_shape_and_a_wrong_declaration_still_fails():
    """A declaration of a class that keeps no tensor (OLMo's LayerNorm) was refused ("nothing to size the layer"): its
    own `normalized_shape` sizes it, as it sizes the tracer's probe; the proof still decides."""
    from transformers.models.olmo.modeling_olmo import OlmoLayerNorm

    norm = OlmoLayerNorm(16)
    try:
        converters.recognize(OlmoLayerNorm, kind="layer", eps=1e-5, weight=None)
        found = recognition(norm)
        assert found.how == "declared" and found.spec is not None and found.spec.normalized_shape == (16,)
        x = torch.randn(2, 3, 16) * 3 + 1
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        torch.testing.assert_close(
            converters.from_spec(converters.to_spec(norm), "torch")(x), (x - mean) / torch.sqrt(var + 1e-5)
        )
        converters.recognizers.declared.forget(OlmoLayerNorm)
        converters.recognize(OlmoLayerNorm, kind="rms", eps=1e-5, weight=None)
        assert "its declaration does not hold" in recognition(norm).reason
    finally:
        converters.recognizers.declared.forget(OlmoLayerNorm)


def test_mobileberts_no_norm_is_not_a_candidate_and_the_model_says_it_found_no_normalization():
    """transformers' MobileBERT (normalization_type="no_norm", its default) puts NoNorm (x * weight + bias) where a
    LayerNorm would be. Its 1-D weight made it a candidate that failed its proof, refusing every MobileBERT; its name
    says there is no norm. The model then says, as any model without one does, that no normalization was found."""
    from transformers import MobileBertConfig, MobileBertModel

    config = MobileBertConfig(
        vocab_size=64,
        hidden_size=32,
        embedding_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        intra_bottleneck_size=16,
        true_hidden_size=16,
        num_feedforward_networks=1,
    )
    model = R.randomise(MobileBertModel(config)).eval()
    assert config.normalization_type == "no_norm" and any(type(m).__name__ == "NoNorm" for m in model.modules())
    inspection = inspect_model(model)
    assert inspection.layers == [] and codes(inspection) == ["no_normalization_found"]
