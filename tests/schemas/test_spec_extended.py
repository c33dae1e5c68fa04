"""Schema version 2: the settings real models need (compute dtype, scale offset, frozen statistics,
a channel-axis layer norm), their rules, the upgrade of version-1 documents, and the refusal of
every adapter that does not hold them."""

from __future__ import annotations

import json

import numpy as np
import pytest

import converters
from converters.expressing import EXPRESSIBLE
from converters.adapters import REGISTRY
from schemas import NotExpressibleError, NormSpec, SpecError, load_spec, save_spec
from schemas.norm_spec import DIGEST_QUIET_DEFAULTS, EXTENDED_DEFAULTS, SCHEMA_VERSION
from schemas.spec_io import SPEC_FILE

from tests.spec_factory import spec_with as _spec_with


def spec_with(kind, **fields):
    """spec_with with an eps and, for BatchNorm, tracked statistics in PyTorch's convention."""
    defaults = {"eps": 1e-5}
    if kind == "batch":
        defaults.update(momentum=0.1, momentum_convention="batch_weight", variance_estimator="unbiased")
    if kind in ("rms",):
        fields.setdefault("bias", False)
    return _spec_with(kind, **{**defaults, **fields})


#: One spec per extended setting, each valid, each using exactly that setting.
EXTENDED = {
    "compute_dtype": lambda: spec_with("rms", dtype="float16", compute_dtype="float32"),
    "cast_before_affine": lambda: spec_with("rms", dtype="float16", compute_dtype="float32", cast_before_affine=True),
    "state_dtype": lambda: spec_with(
        "rms",
        dtype="float16",
        compute_dtype="float32",
        state_dtype="float32",
        tensors={"scale": np.linspace(0.5001, 2.0, 5, dtype=np.float32)},
    ),
    "scale_offset": lambda: spec_with("rms", scale_offset=1.0),
    "frozen": lambda: spec_with("batch", frozen=True, momentum=None, momentum_convention=None, variance_estimator=None),
    "layout": lambda: spec_with("layer", normalized_shape=(4,), layout="channels_first"),
}


def test_a_version_1_document_is_upgraded_on_read_and_computes_what_it_did(tmp_path):
    spec = spec_with("batch")
    save_spec(spec, tmp_path / "s")
    document = json.loads((tmp_path / "s" / SPEC_FILE).read_text())
    for name in EXTENDED_DEFAULTS:
        document.pop(name)
    document["schema_version"] = 1
    (tmp_path / "s" / SPEC_FILE).write_text(json.dumps(document))
    loaded = load_spec(tmp_path / "s")
    assert loaded.schema_version == SCHEMA_VERSION == 2
    assert loaded == spec and loaded.extended_settings() == {}


@pytest.mark.parametrize("setting", sorted(EXTENDED))
def test_each_extended_setting_is_named_by_extended_settings_and_survives_save_and_load(setting, tmp_path):
    spec = EXTENDED[setting]()
    assert setting in spec.extended_settings()
    save_spec(spec, tmp_path / "s")
    assert load_spec(tmp_path / "s") == spec


def _unheld() -> list[tuple[str, str]]:
    """(setting, framework) pairs whose adapter does not hold the setting (those that do are tested with their
    conversion)."""
    pairs = []
    for setting, build in sorted(EXTENDED.items()):
        spec = build()
        used = set(spec.extended_settings()) - set(
            EXPRESSIBLE
        )  # those a stock layer computes are expressed, not refused
        pairs += [(setting, f) for f in REGISTRY.framework_names if not used <= REGISTRY.get(f, spec.kind).holds]
    return pairs


@pytest.mark.parametrize("setting", sorted(EXPRESSIBLE))
def test_a_setting_no_adapter_holds_but_a_stock_layer_computes_is_expressed_and_reported(setting):
    spec = EXTENDED[setting]()
    for framework in REGISTRY.framework_names:
        converters.from_spec(spec, framework)
        [line] = [t for t in converters.last_report().layers[0].translations if t.setting == setting]
        assert line.fate in ("translated", "approximate") and line.note, (framework, line)


@pytest.mark.parametrize("setting, framework", _unheld())
def test_an_adapter_that_does_not_hold_a_setting_refuses_it_naming_layer_and_setting(setting, framework):
    spec = EXTENDED[setting]()
    adapter = REGISTRY.get(framework, spec.kind)
    with pytest.raises(NotExpressibleError) as raised:
        converters.from_spec(spec, framework)
    assert raised.value.setting in set(spec.extended_settings()) - adapter.holds and raised.value.layer == spec.name


def test_bfloat16_is_an_extended_setting():
    assert NormSpec.model_fields["dtype"].annotation.__args__[0] == "bfloat16"


@pytest.mark.parametrize(
    "build, setting",
    [
        (lambda: spec_with("rms", compute_dtype="float32"), "compute_dtype"),  # equal to dtype: one spelling only
        (lambda: spec_with("rms", cast_before_affine=True), "cast_before_affine"),
        (lambda: spec_with("rms", scale_offset=float("nan")), "scale_offset"),
        (lambda: spec_with("rms", scale=False, scale_offset=1.0), "scale_offset"),
        (
            lambda: spec_with("rms", dtype="float16", state_dtype="float32"),
            "state_dtype",
        ),  # no compute dtype to apply it in
        (
            lambda: spec_with(
                "rms", dtype="float16", compute_dtype="float32", cast_before_affine=True, state_dtype="float32"
            ),
            "state_dtype",
        ),
        (
            lambda: spec_with("rms", dtype="float16", compute_dtype="float32", state_dtype="float32"),
            "scale",
        ),  # float16 tensors
        (lambda: spec_with("layer", frozen=True), "frozen"),
        (lambda: spec_with("batch", frozen=True), "momentum"),
        (
            lambda: spec_with(
                "batch",
                frozen=True,
                track_running_stats=False,
                momentum=None,
                momentum_convention=None,
                variance_estimator=None,
                tensors={},
            ),
            "frozen",
        ),
        (lambda: spec_with("layer", normalized_shape=(4,), layout="channels_last"), "layout"),
        (lambda: spec_with("layer", normalized_shape=(2, 4), layout="channels_first"), "normalized_shape"),
    ],
)
def test_invalid_extended_settings_are_refused_naming_the_setting(build, setting):
    with pytest.raises(SpecError) as raised:
        build()
    assert raised.value.setting == setting


def test_state_dtype_is_left_out_of_the_config_unless_set_so_earlier_content_digests_hold():
    """The manifest's content digest hashes config_dict(): a key added for every spec would give every model registered
    before the field a new digest, so the same model registered again would be a new version instead of the old one."""
    plain = spec_with("layer", normalized_shape=(4,))
    assert "state_dtype" not in plain.config_dict()
    assert set(plain.config_dict()) == set(NormSpec.model_fields) - {"tensors", *DIGEST_QUIET_DEFAULTS}
    assert NormSpec(**plain.config_dict(), tensors=plain.tensors) == plain
    assert EXTENDED["state_dtype"]().config_dict()["state_dtype"] == "float32"
