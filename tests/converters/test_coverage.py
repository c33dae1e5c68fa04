"""Coverage: what adding a kind or a framework must provide, checked for every kind and every registered framework.

The recipe in docs/contributing.md is exactly these checks: a kind needs an INFO, a reference, a
KindAdapter in every framework and rows in tests/cases.py; a framework needs a FrameworkAdapter,
KindAdapters for every kind (tests/converters/test_registry.py::test_every_framework_has_an_adapter_for_every_kind),
a ModelAdapter, its model files, object recognizers, and its facts in
every kind's INFO.
"""

from __future__ import annotations

from typing import get_args

import pytest

from converters import REGISTRY, reference
from converters.adapters import MODEL_FILES
from converters.model_adapter import ModelAdapter
from converters.recognizers import RECOGNIZERS, ObjectRecognizer
from schemas import FRAMEWORKS, KINDS
from schemas.kinds import KIND_INFO, VALIDATORS, KindInfo
from schemas.manifest import ArtifactFormat, ArtifactManifest, StructureFormat

from tests.cases import CASES


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_an_info_a_validator_and_a_reference(kind):
    info = KIND_INFO[kind]
    assert isinstance(info, KindInfo) and info.kind == kind
    assert callable(VALIDATORS[kind])
    module = reference.KIND_MODULES[kind]
    assert callable(module.forward)
    assert callable(getattr(module, "batch_moments", None)) or not info.running_stats, (
        "a kind with running statistics needs batch_moments"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_rows_in_the_case_table(kind):
    assert any(case.spec.kind == kind for case in CASES), f"tests/cases.py has no row of kind '{kind}'"


def test_the_registered_frameworks_are_the_vocabulary_s():
    assert REGISTRY.framework_names == list(FRAMEWORKS)


def test_each_framework_info_is_its_package_s_and_agrees_with_the_stored_formats():
    """The store floor cannot read FrameworkInfo (it imports schemas alone): schemas/manifest.py keeps its own names of
    the formats and frameworks, which must be the infos'."""
    infos = REGISTRY.infos()
    assert [(info.name, info.package) for info in infos] == list(REGISTRY.packages.items())
    assert set(get_args(StructureFormat)) == {
        info.structure_format for info in infos if info.structure_format is not None
    } | {fmt for info in infos for fmt in info.folder_formats}
    origins = {fmt for info in infos for fmt in info.format_origins}
    assert origins <= set(get_args(ArtifactFormat))
    assert set(get_args(ArtifactManifest.model_fields["framework"].annotation)) == set(FRAMEWORKS)


@pytest.mark.parametrize("framework", REGISTRY.framework_names)
def test_every_framework_has_a_model_adapter_its_files_and_recognizers(framework):
    adapter = REGISTRY.model_adapter(framework)
    assert isinstance(adapter, ModelAdapter) and adapter.framework == framework
    assert any(owner == framework for owner, _ in MODEL_FILES.values()), (
        f"no model file suffix loads {framework} models (adapters.MODEL_FILES)"
    )
    assert RECOGNIZERS.of(framework, ObjectRecognizer), (
        f"no recognizer tells {framework} normalizations (STOCK_RECOGNIZERS in its adapter package's recognizers/)"
    )


@pytest.mark.parametrize("framework", REGISTRY.framework_names)
def test_every_kind_states_each_framework_s_default_eps(framework):
    assert all(framework in info.default_eps for info in KIND_INFO.values())
