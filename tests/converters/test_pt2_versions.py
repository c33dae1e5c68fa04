"""A `.pt2` from an older or newer torch is read as its writer meant it or refused naming both versions, never mis-read.

Each archive is a genuine torch.export.save file (tests/pt2_crafting.py) whose models/model.json says another schema
version, as a torch before or after this one writes it: another major version; a newer minor one that holds a key or a
union member this torch's schema does not define (which torch's own reader drops without a word, or fails on with a
KeyError); a newer or older minor one holding only what this torch knows, which reads as the genuine file does.
"""

from __future__ import annotations

import re

import pytest
import torch

from converters.torch_adapter import torch_internals
from converters.torch_adapter.pt2.archive import load_exported_program
from converters.torch_adapter.pt2.versions import unknown_key
from schemas import InputFileError
from tests.converters.test_pt2_reading import PROGRAMS, _same_program
from tests.pt2_crafting import craft, first_node, genuine_pt2

MAJOR, MINOR = torch_internals.reader_schema_version()
TORCH = torch_internals.torch_version()


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    return genuine_pt2(tmp_path_factory.mktemp("genuine") / "model.pt2")


def _versioned(major: int, minor: int, writer: str = "2.99.0", edit=None):
    def program(document: dict) -> None:
        document["schema_version"] = {"major": major, "minor": minor}
        document["torch_version"] = writer
        if edit is not None:
            edit(document)

    return program


def _new_node_field(document: dict) -> None:
    first_node(document, "torch.ops.aten.conv2d")["is_fused_in_place"] = True


def _new_union_member(document: dict) -> None:
    first_node(document, "torch.ops.aten.conv2d")["inputs"][2]["arg"] = {"as_symbolic_tuple": [1, 1]}


def _new_top_level_field(document: dict) -> None:
    document["quantization_plan"] = {"scheme": "int4"}


REFUSED = {
    "a newer major version": (
        _versioned(MAJOR + 1, 0),
        rf"schema version {MAJOR + 1}\.0 \(written by torch 2\.99\.0\)",
    ),
    "an older major version": (
        _versioned(MAJOR - 1, 3, writer="2.4.0"),
        rf"schema version {MAJOR - 1}\.3 \(written by torch 2\.4\.0\)",
    ),
    "the placeholder version 0.0": (_versioned(0, 0), r"schema version 0\.0"),
    "a newer minor version with a field torch would drop": (
        _versioned(MAJOR, MINOR + 1, edit=_new_node_field),
        r"'graph_module\.graph\.nodes\[\d+\]\.is_fused_in_place' is not in schema",
    ),
    "a newer minor version with a union member torch does not know": (
        _versioned(MAJOR, MINOR + 1, edit=_new_union_member),
        r"'graph_module\.graph\.nodes\[\d+\]\.inputs\[2\]\.arg\.as_symbolic_tuple'",
    ),
    "a newer minor version with a top-level field": (
        _versioned(MAJOR, MINOR + 5, edit=_new_top_level_field),
        r"'quantization_plan'",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_program_this_torch_would_misread_is_refused_naming_both_versions(case, genuine, tmp_path):
    edit, named = REFUSED[case]
    path = craft(genuine, tmp_path / "model.pt2", edit_program=edit)
    with pytest.raises(InputFileError) as refused:
        load_exported_program(path)
    message = str(refused.value)
    assert re.search(named, message), message
    assert f"this is torch {TORCH} (schema {MAJOR}.{MINOR})" in message and "models/model.json" in message
    assert "\n" not in message and "Traceback" not in message


@pytest.mark.parametrize(
    "major, minor",
    [(MAJOR, MINOR + 1), (MAJOR, MINOR + 40), (MAJOR, 0), (MAJOR, max(MINOR - 1, 0))],
    ids=["next minor", "far newer minor", "minor 0", "previous minor"],
)
def test_another_minor_version_holding_only_what_this_torch_knows_reads_as_the_genuine_file(
    major, minor, genuine, tmp_path
):
    path = craft(genuine, tmp_path / "model.pt2", edit_program=_versioned(major, minor))
    _same_program(load_exported_program(path), load_exported_program(genuine))


def test_a_schema_version_that_is_not_two_integers_is_refused(genuine, tmp_path):
    def edit(document: dict) -> None:
        document["schema_version"] = {"major": str(MAJOR), "minor": MINOR}

    with pytest.raises(InputFileError, match=r"'schema_version' is .* expected \{\"major\": N, \"minor\": N\}"):
        load_exported_program(craft(genuine, tmp_path / "model.pt2", edit_program=edit))


def test_a_writer_version_that_is_not_a_version_is_not_echoed(genuine, tmp_path):
    path = craft(
        genuine, tmp_path / "model.pt2", edit_program=_versioned(MAJOR + 1, 0, writer="<script>alert(1)</script>")
    )
    with pytest.raises(InputFileError, match="written by an unnamed torch") as refused:
        load_exported_program(path)
    assert "script" not in str(refused.value)


@pytest.mark.parametrize("name, program", PROGRAMS, ids=lambda value: value if isinstance(value, str) else "")
def test_every_key_torch_writes_is_one_its_schema_defines(name, program):
    """The walk that decides a newer minor version finds nothing unknown in what this torch writes
    (no false refusal)."""
    import json

    from torch._export.serde.serialize import serialize

    assert unknown_key(json.loads(serialize(program).exported_program.decode("utf-8"))) is None
