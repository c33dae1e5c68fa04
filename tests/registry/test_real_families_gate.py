"""The registration gate on real models: a row per family (transformers models built from tiny configs, random state),
in float32 and bfloat16, each failing if the family were missed, counted differently by inspect and register, read with
another eps / scale offset / compute dtype / frozen flag, left unchecked ("0/0"), or refused.

Expected values are the modules' own settings (their eps attributes, the class's formula), never normbridge's reading.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

from converters.models.inspection import inspect_model, inspect_path
from registry.service import Registry
from tests import real_norms as R


@dataclass(frozen=True)
class Row:
    id: str
    build: Callable[[], torch.nn.Module]
    family: str  # the class the model's hand-written normalizations are
    dtype: torch.dtype
    kind: str
    scale_offset: float = 0.0
    frozen: bool = False
    compute_dtype: str | None = None
    cast_before_affine: bool = False
    layout: str | None = None  # of the family's channels-first instances


F32, BF16 = torch.float32, torch.bfloat16
ROWS = [
    Row("Llama", R.llama, "LlamaRMSNorm", F32, "rms"),
    Row("Qwen2", R.qwen2, "Qwen2RMSNorm", F32, "rms"),
    Row("Gemma", R.gemma, "GemmaRMSNorm", F32, "rms", scale_offset=1.0),
    Row("T5", R.t5, "T5LayerNorm", F32, "rms"),
    Row("ConvNeXt", R.convnext, "ConvNextLayerNorm", F32, "layer", layout="channels_first"),
    Row("ConvNeXtV2", R.convnextv2, "ConvNextV2LayerNorm", F32, "layer", layout="channels_first"),
    Row("Qwen3", R.qwen3, "Qwen3RMSNorm", F32, "rms"),  # its q/k norms read a view the attention makes
    Row("Mamba", R.mamba, "MambaRMSNorm", F32, "rms"),  # the block reuses its norm's input cast
    Row("DETR", R.detr, "DetrFrozenBatchNorm2d", F32, "batch", frozen=True, layout="channels_first"),
    Row("Llama-bf16", R.llama, "LlamaRMSNorm", BF16, "rms", compute_dtype="float32", cast_before_affine=True),
    Row("Gemma-bf16", R.gemma, "GemmaRMSNorm", BF16, "rms", scale_offset=1.0, compute_dtype="float32"),
    Row("T5-bf16", R.t5, "T5LayerNorm", BF16, "rms", compute_dtype="float32", cast_before_affine=True),
    Row("DETR-bf16", R.detr, "DetrFrozenBatchNorm2d", BF16, "batch", frozen=True, layout="channels_first"),
]


def model_of(row: Row) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = R.randomise(row.build()).to(row.dtype)
    if hasattr(model, "config"):
        model.config.use_cache = False
    return model


def own_eps(module: torch.nn.Module) -> float:
    """The eps the module computes with, from its own attributes (DETR's frozen BatchNorm writes 1e-5 in its
    forward)."""
    for name in ("variance_epsilon", "eps"):
        if hasattr(module, name):
            return float(getattr(module, name))
    return 1e-5


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    folder = tmp_path_factory.mktemp("registry")
    return Registry(db=f"sqlite:///{folder / 'registry.db'}", blobs=str(folder / "blobs"), user="tester")


def assert_registered_and_checked(registry, name: str, model_or_path, inspected: list[str]) -> list[dict]:
    """Registration passes with one check per inspected layer (the same layers, none unrecognised);
    the manifest's specs."""
    result = registry.register(name, model_or_path)
    assert result.unrecognised == []
    assert len(result.checks) == len(inspected) > 0 and all(c.passed for c in result.checks)
    assert all(
        any(t.status == "passed" for t in c.targets) for c in result.checks
    )  # checked somewhere, not only refused
    manifest = registry.manifest(f"{name}@1")
    assert [n.path for n in manifest.normalizers] == inspected  # one count: inspect and register list the same layers
    return [n.spec | {"path": n.path} for n in manifest.normalizers]


def assert_family_read_exactly(row: Row, specs: list[dict], family: dict[str, torch.nn.Module]) -> None:
    read = {s["path"]: s for s in specs if s["source"]["layer_type"] == row.family}
    assert set(read) == set(family), f"{row.family}: found {sorted(read)}, the model has {sorted(family)}"
    for path, module in family.items():
        spec = read[path]
        assert (spec["kind"], spec["eps"], spec["scale_offset"], spec["frozen"]) == (
            row.kind,
            own_eps(module),
            row.scale_offset,
            row.frozen,
        )
        assert (spec["dtype"], spec["compute_dtype"], spec["cast_before_affine"]) == (
            str(row.dtype).removeprefix("torch."),
            row.compute_dtype,
            row.cast_before_affine,
        )
        channels_first = getattr(module, "data_format", "channels_first") == "channels_first"
        assert spec["layout"] == (row.layout if channels_first else None)


def family_modules(model: torch.nn.Module, row: Row) -> dict[str, torch.nn.Module]:
    found = {path: m for path, m in model.named_modules() if type(m).__name__ == row.family}
    assert found, f"the {row.id} model holds no {row.family}: the test builds the wrong model"
    return found


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_a_live_model_registers_with_every_normalization_checked_and_read_as_it_computes(registry, row):
    model = model_of(row)
    inspected = [layer.path for layer in inspect_model(model).layers]
    specs = assert_registered_and_checked(registry, f"{row.id}-module", model, inspected)
    assert_family_read_exactly(row, specs, family_modules(model, row))


def exported(row: Row, model: torch.nn.Module):
    """(program, the module it was exported from): T5's encoder alone (the whole model wants decoder inputs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if row.family == "T5LayerNorm":
            return torch.export.export(model.encoder, (torch.randint(0, 64, (1, 5)),)), model.encoder
        if row.kind == "rms":
            return torch.export.export(model, (torch.randint(0, 64, (1, 5)),)), model
        size = 32 if row.family.startswith("ConvNext") else 64
        return torch.export.export(model, (torch.randn(1, 3, size, size, dtype=row.dtype),)), model


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_a_saved_program_registers_with_the_same_layers_inspect_lists(registry, row, tmp_path):
    program, model = exported(row, model_of(row))
    path = tmp_path / f"{row.id}.pt2"
    torch.export.save(program, path)
    inspected = [layer.path for layer in inspect_path(path).layers]
    specs = assert_registered_and_checked(registry, f"{row.id}-pt2", path, inspected)
    assert_family_read_exactly(row, specs, family_modules(model, row))


def test_a_gemma_norm_converts_to_a_stock_rmsnorm_exactly_in_float32_and_the_report_says_what_is_not_kept():
    import converters

    gemma = R.randomise(R.gemma()).layers[0].input_layernorm
    spec = converters.to_spec(gemma)
    stock = converters.from_spec(spec, "torch", restore_source_class=False)
    report = converters.last_report()
    assert isinstance(stock, torch.nn.RMSNorm)
    np.testing.assert_array_equal(
        stock.weight.detach().numpy(), (1.0 + gemma.weight.detach()).numpy()
    )  # Gemma's own factor
    x = torch.randn(3, 4, gemma.weight.shape[0])
    with torch.no_grad():
        torch.testing.assert_close(stock(x), gemma(x), rtol=2e-6, atol=2e-6)
    [folded] = [t for t in report.layers[0].translations if t.setting == "scale_offset"]
    assert folded.fate == "translated" and "exact in eval mode" in folded.note
    assert any("1 + w, not w" in w for w in report.layers[0].warnings)
    narrow = converters.from_spec(converters.to_spec(gemma.to(torch.bfloat16)), "torch", restore_source_class=False)
    assert isinstance(narrow, torch.nn.RMSNorm)
    [rounded] = [t for t in converters.last_report().layers[0].translations if t.setting == "scale_offset"]
    assert rounded.fate == "approximate" and "half a bfloat16 ulp" in rounded.note


@pytest.mark.parametrize(
    "row", [r for r in ROWS if r.dtype == F32 and r.id in ("Llama", "Gemma", "ConvNeXt", "DETR")], ids=lambda r: r.id
)
def test_converting_back_to_torch_rebuilds_the_source_class_with_bit_identical_state(row):
    import converters

    model = model_of(row)
    path, module = next(iter(family_modules(model, row).items()))
    spec = converters.to_spec(module)
    assert spec.source.module_class == f"{type(module).__module__}.{type(module).__qualname__}"
    back = converters.from_spec(spec, "torch")
    assert type(back) is type(module)
    for name, tensor in module.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    c = spec.num_features or spec.normalized_shape[0]
    x = torch.randn((2, c, 3, 5) if spec.layout == "channels_first" else (2, 3, c), dtype=row.dtype)
    with torch.no_grad():
        assert torch.equal(back.eval()(x), module.eval()(x))  # the same class and state: the same numbers, bit for bit
