"""NormSpec: validation at construction, immutability, JSON + safetensors round trip, JSON Schema."""

from __future__ import annotations

import json

import numpy as np
import pydantic
import pytest

from schemas import InputFileError, NormSpec, SpecError, load_spec, save_spec, spec_to_json
from schemas.json_schema import SCHEMA_DIR, schema_documents
from schemas.spec_io import SPEC_FILE, TENSORS_FILE

from tests.cases import CASES
from tests.spec_factory import make_spec


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_save_load_round_trip_is_exact_for_every_kind(case, tmp_path):
    save_spec(case.spec, tmp_path / "s")
    loaded = load_spec(tmp_path / "s")
    assert loaded == case.spec
    for name, array in case.spec.tensors.items():
        assert loaded.tensors[name].tobytes() == array.tobytes()
        assert loaded.tensors[name].dtype == array.dtype and loaded.tensors[name].shape == array.shape


def test_spec_is_frozen_and_tensors_read_only():
    spec = make_spec("batch")
    with pytest.raises(Exception):
        spec.eps = 1.0
    with pytest.raises(ValueError):
        spec.tensors["running_var"][0] = 5.0


def test_spec_copies_tensors_so_the_caller_cannot_mutate_it():
    scale = np.ones(4, np.float32)
    spec = NormSpec(kind="layer", normalized_shape=(4,), eps=1e-5, bias=False, tensors={"scale": scale})
    scale[0] = 3.0
    assert spec.tensors["scale"][0] == 1.0


@pytest.mark.parametrize(
    "changes, setting",
    [
        ({"eps": 0.0}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"momentum": 1.5}, "momentum"),
        ({"momentum_convention": None}, "momentum_convention"),
        ({"num_groups": 2}, "num_groups"),
        ({"layout": None}, "layout"),
        ({"variance_estimator": None}, "variance_estimator"),
        ({"scale": False}, "scale"),
    ],
)
def test_invalid_batch_specs_name_layer_and_setting(changes, setting):
    spec = make_spec("batch", name="stem.bn")
    with pytest.raises(SpecError) as info:
        spec.replace(**changes)
    assert "stem.bn" in str(info.value) and setting in str(info.value)


@pytest.mark.parametrize(
    "tensor, value, message",
    [
        ("running_var", np.array([-1.0, 1, 1, 1, 1, 1], np.float32), "negative"),
        ("running_mean", np.array([np.nan, 1, 1, 1, 1, 1], np.float32), "NaN or Inf"),
        ("scale", np.array([np.inf, 1, 1, 1, 1, 1], np.float32), "NaN or Inf"),
        ("scale", np.ones(5, np.float32), "expected (6,)"),
        ("bias", np.ones(6, np.float64), "dtype float64"),
    ],
)
def test_bad_state_tensors_are_rejected(tensor, value, message):
    spec = make_spec("batch", name="layer1.0.bn1")
    with pytest.raises(SpecError) as info:
        spec.replace(tensors={**spec.tensors, tensor: value})
    assert message in str(info.value) and "layer1.0.bn1" in str(info.value) and tensor in str(info.value)


def test_group_count_must_divide_channels():
    with pytest.raises(SpecError, match="not divisible"):
        make_spec("group", num_features=6, num_groups=4)


def test_rms_has_no_bias():
    spec = make_spec("rms")
    with pytest.raises(SpecError, match="no bias"):
        spec.replace(bias=True, tensors={**spec.tensors, "bias": np.zeros((4, 5), np.float32)})


def test_cumulative_momentum_needs_the_counter():
    spec = make_spec("batch", momentum=None)
    tensors = {k: v for k, v in spec.tensors.items() if k != "num_batches_tracked"}
    with pytest.raises(SpecError, match="num_batches_tracked"):
        spec.replace(tensors=tensors)


def test_momentum_is_compared_across_conventions():
    torch_style = make_spec("batch", momentum=0.1, convention="batch_weight")
    keras_style = torch_style.replace(momentum=0.9, momentum_convention="running_weight")
    assert torch_style == keras_style
    assert keras_style.momentum_as("batch_weight") == 0.1
    assert torch_style.momentum_as("running_weight") == 0.9


def test_json_describes_tensors_and_loads_only_with_matching_safetensors(tmp_path):
    spec = make_spec("batch")
    folder = save_spec(spec, tmp_path / "s")
    document = json.loads((folder / SPEC_FILE).read_text())
    assert document["tensors"]["running_var"] == {"dtype": "float32", "shape": [6]}
    assert (
        document["eps"] == 0.001 and document["momentum"] == 0.01 and document["momentum_convention"] == "batch_weight"
    )
    (folder / TENSORS_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(InputFileError, match="safetensors"):
        load_spec(folder)


def test_unknown_schema_version_is_refused(tmp_path):
    folder = save_spec(make_spec("layer"), tmp_path / "s")
    document = json.loads((folder / SPEC_FILE).read_text())
    document["schema_version"] = 99
    (folder / SPEC_FILE).write_text(json.dumps(document))
    with pytest.raises(SpecError, match="schema_version 99"):
        load_spec(folder)


@pytest.mark.skipif(
    tuple(int(part) for part in pydantic.VERSION.split(".")[:2]) < (2, 11),
    reason="the files are written by pydantic >= 2.11; older releases spell a described $ref as allOf (same schema)",
)
def test_json_schema_files_are_current():
    """The committed JSON Schema files match the models (run `make schemas` after changing them)."""
    for name, text in schema_documents().items():
        assert (SCHEMA_DIR / name).read_text() == text, f"{name} is stale: run `make schemas`"


def test_canonical_json_is_stable():
    spec = make_spec("group")
    assert spec_to_json(spec) == spec_to_json(make_spec("group"))
