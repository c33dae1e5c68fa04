"""program_schema.quick_program_from_dict builds the same torch schema dataclasses as torch's own _dict_to_dataclass.

The oracle is torch's function on the JSON torch.export.save writes, for programs torch and transformers make
(dynamic shapes, a training-mode BatchNorm, a Llama decoder), compared by value, by repr (repr tells 1 from 1.0) and
object by object (class, attributes in order, a union's tag and its class).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch._export.serde import schema
from torch._export.serde.serialize import _dict_to_dataclass, serialize

from torch._export.serde.union import _Union, _UnionTag

from converters.torch_adapter.pt2.program_schema import (
    quick_program_from_dict as program_from_dict,
)  # the faster path alone, never its fallback
from tests import real_norms as R


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.ln = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.LayerNorm(4, eps=1e-3)

    def forward(self, x):
        y = self.bn(self.conv(x)).permute(0, 2, 3, 1)
        return self.ln(y * 0.5 + 1.25).flatten(1).sum(-1)


def _programs():
    batch = torch.export.Dim("batch", min=2, max=64)
    yield (
        "train-mode BatchNorm, dynamic batch",
        torch.export.export(Blocks().train(), (torch.randn(4, 3, 8, 8),), dynamic_shapes=({0: batch},)),
    )
    yield "eval", torch.export.export(Blocks().eval(), (torch.randn(2, 3, 8, 8),))
    yield (
        "transformers Llama",
        torch.export.export(R.randomise(R.llama()), (torch.randint(0, 64, (1, 5)),), kwargs={"use_cache": False}),
    )


def _same_objects(ours, torchs, where: str = "program") -> int:
    """How many objects were compared; fails where the two differ in class, attributes (in order) or a union's tag."""
    assert type(ours) is type(torchs), where
    if isinstance(torchs, (list, tuple)):
        assert len(ours) == len(torchs), where
        return 1 + sum(_same_objects(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(ours, torchs)))
    if isinstance(torchs, dict):
        assert list(ours) == list(torchs), where
        return 1 + sum(_same_objects(ours[k], torchs[k], f"{where}[{k!r}]") for k in torchs)
    if hasattr(torchs, "__dict__") and not isinstance(torchs, type):
        mine, theirs = object.__getattribute__(ours, "__dict__"), object.__getattribute__(torchs, "__dict__")
        assert list(mine) == list(theirs), where
        if isinstance(torchs, _Union):
            assert (
                type(mine["_type"]) is _UnionTag
                and mine["_type"] == theirs["_type"]
                and mine["_type"]._cls is theirs["_type"]._cls
            ), where
        return 1 + sum(_same_objects(mine[k], theirs[k], f"{where}.{k}") for k in theirs if k != "_type")
    assert type(ours) is type(torchs) and ours == torchs, where
    return 1


@pytest.mark.parametrize("name, program", list(_programs()), ids=lambda value: value if isinstance(value, str) else "")
def test_the_same_dataclasses_as_torch(name, program):
    document = json.loads(serialize(program).exported_program.decode("utf-8"))
    ours, torchs = program_from_dict(document), _dict_to_dataclass(schema.ExportedProgram, document)
    assert ours == torchs
    assert repr(ours) == repr(torchs)
    assert _same_objects(ours, torchs) > 100
    assert len(ours.graph_module.graph.nodes) > 3


def test_unknown_keys_are_ignored_and_a_bad_union_is_refused_as_torch_does():
    document = json.loads(
        serialize(torch.export.export(Blocks().eval(), (torch.randn(2, 3, 8, 8),))).exported_program.decode("utf-8")
    )
    document["from_the_future"] = 1
    assert program_from_dict(document) == _dict_to_dataclass(schema.ExportedProgram, document)
    node = document["graph_module"]["graph"]["nodes"][0]
    node["inputs"][0]["arg"] = {"as_tensor": {"name": "x"}, "as_int": 1}  # a union holds exactly one member
    for convert in (program_from_dict, lambda d: _dict_to_dataclass(schema.ExportedProgram, d)):
        with pytest.raises(AssertionError, match="expected dict with 1 key"):
            convert(document)


def test_a_union_member_that_is_not_a_field_is_refused_as_torch_does():
    document = json.loads(
        serialize(torch.export.export(Blocks().eval(), (torch.randn(2, 3, 8, 8),))).exported_program.decode("utf-8")
    )
    document["graph_module"]["graph"]["nodes"][0]["inputs"][0]["arg"] = {"_type": {"name": "x"}}
    errors = []
    for convert in (program_from_dict, lambda d: _dict_to_dataclass(schema.ExportedProgram, d)):
        with pytest.raises(Exception) as caught:
            convert(document)
        errors.append((type(caught.value), str(caught.value)))
    assert errors[0] == errors[1]
