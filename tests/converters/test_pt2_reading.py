"""pt2/archive.load_exported_program builds the ExportedProgram torch itself builds, node for node.

The oracle is torch's own reader (`torch.export.load`) on files torch.export.save wrote here: every node's name, op,
target, arguments and meta (meta["val"] fake tensors by sizes, strides, dtype, device, requires_grad, storage size,
fake mode), the signature, range constraints, module call graph, generated code and state dict. The programs cover a
dynamic batch (the symbolic path of pt2/deserializer.py), bfloat16, training-mode BatchNorm, an RMSNorm decoder, a
Llama from transformers, torch.cond and an unbacked size (meta["unbacked_bindings"], which torch walks for and
pt2/deserializer.py skips looking for once nothing is pending).
"""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from converters.torch_adapter.pt2.program_schema import (
    quick_program_from_dict as program_from_dict,
)  # the faster path alone, never its fallback
from converters.torch_adapter.pt2.archive import load_exported_program
from converters.torch_adapter.pt2.deserializer import quick_deserialize, static_fake, unwritten_code
from tests import real_norms as R
from tests.converters.test_program_schema import Blocks  # the same small conv + BatchNorm + LayerNorm program


class Decoder(nn.Module):
    """Two pre-norm blocks with RMSNorm, attention-like matmuls and a transposed (non-contiguous) view."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.norms = nn.ModuleList(nn.RMSNorm(width, eps=1e-6) for _ in range(4))
        self.mixes = nn.ModuleList(nn.Linear(width, width) for _ in range(4))
        self.register_buffer("scale", torch.full((width,), 0.5))

    def forward(self, x):
        for norm, mix in zip(self.norms, self.mixes):
            h = norm(x)
            x = x + mix(h).softmax(-1) @ h.transpose(-1, -2)[..., :1].expand(-1, -1, h.shape[-1]).transpose(-1, -2)
        return x * self.scale


class Branches(nn.Module):
    """A torch.cond whose branches become GraphModules of their own (subgraphs the deserializer writes code for)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda y: self.norm(y), lambda y: y * 2.0, (x,))


class Selected(nn.Module):
    """Rows picked by nonzero: a size no input gives (an unbacked symbol torch binds to the node that makes it)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(8)

    def forward(self, x):
        return self.norm(x[torch.nonzero(x[:, 0] > 0).squeeze(-1)])


def _programs():
    batch = torch.export.Dim("batch", min=2, max=64)
    yield (
        "train BatchNorm, dynamic batch",
        torch.export.export(Blocks().train(), (torch.randn(4, 3, 8, 8),), dynamic_shapes=({0: batch},)),
    )
    yield "eval BatchNorm", torch.export.export(Blocks().eval(), (torch.randn(2, 3, 8, 8),))
    yield (
        "bfloat16 RMSNorm decoder",
        torch.export.export(Decoder().to(torch.bfloat16), (torch.randn(2, 5, 16, dtype=torch.bfloat16),)),
    )
    yield (
        "RMSNorm decoder, dynamic sequence",
        torch.export.export(
            Decoder(), (torch.randn(2, 5, 16),), dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=32)},)
        ),
    )
    yield (
        "transformers Llama",
        torch.export.export(R.randomise(R.llama()), (torch.randint(0, 64, (1, 5)),), kwargs={"use_cache": False}),
    )
    yield "torch.cond branches", torch.export.export(Branches(), (torch.randn(3, 8),))
    yield "dynamic rows from nonzero (unbacked)", torch.export.export(Selected(), (torch.randn(6, 8),))


PROGRAMS = list(_programs())


def _is_symbolic(value) -> bool:
    return isinstance(value, FakeTensor) and any(not isinstance(d, int) for d in (*value.shape, *value.stride()))


def _same_value(ours, torchs, where: str) -> None:
    assert type(ours) is type(torchs), where
    if isinstance(torchs, torch.Tensor):
        assert (str(ours.shape), str(ours.stride()), str(ours.storage_offset())) == (
            str(torchs.shape),
            str(torchs.stride()),
            str(torchs.storage_offset()),
        ), where
        assert (ours.dtype, ours.device, ours.layout, ours.requires_grad, ours.is_leaf, ours.grad_fn) == (
            torchs.dtype,
            torchs.device,
            torchs.layout,
            torchs.requires_grad,
            torchs.is_leaf,
            torchs.grad_fn,
        ), where
        assert str(ours.untyped_storage().nbytes()) == str(torchs.untyped_storage().nbytes()), where
        assert (ours.is_contiguous(), ours.is_inference()) == (torchs.is_contiguous(), torchs.is_inference()), where
        if not torchs.is_inference():  # an inference tensor has no version counter
            assert ours._version == torchs._version, where
        assert vars(ours).keys() == vars(torchs).keys(), where
        assert (ours.constant, ours.real_tensor, ours.pytype, ours.dispatch_keys) == (None, None, None, None), where
        assert torch._C._dispatch_keys(ours) == torch._C._dispatch_keys(torchs), where
    elif isinstance(torchs, (list, tuple)):
        assert len(ours) == len(torchs), where
        for index, (a, b) in enumerate(zip(ours, torchs)):
            _same_value(a, b, f"{where}[{index}]")
    else:
        assert str(ours) == str(torchs), where


def _same_program(ours, torchs) -> None:
    ours_nodes, torchs_nodes = list(ours.graph.nodes), list(torchs.graph.nodes)
    assert [n.name for n in ours_nodes] == [n.name for n in torchs_nodes]
    modes = set()
    for a, b in zip(ours_nodes, torchs_nodes):
        assert (a.op, a.target, str(a.args), str(a.kwargs)) == (b.op, b.target, str(b.args), str(b.kwargs)), a.name
        assert a.meta.keys() == b.meta.keys(), a.name
        for key in a.meta:
            if key == "val":
                _same_value(a.meta["val"], b.meta["val"], a.name)
            else:
                assert str(a.meta[key]) == str(b.meta[key]), (a.name, key)
        if isinstance(a.meta.get("val"), FakeTensor):
            modes.add(id(a.meta["val"].fake_mode))
    assert len(modes) == 1  # one fake mode (and ShapeEnv) for the whole program, as torch's
    assert ours.graph_signature == torchs.graph_signature
    assert str(ours.range_constraints) == str(torchs.range_constraints)
    assert str(ours.module_call_graph) == str(torchs.module_call_graph)
    assert type(ours.graph._codegen) is type(torchs.graph._codegen)
    modules, torch_modules = dict(ours.graph_module.named_modules()), dict(torchs.graph_module.named_modules())
    assert modules.keys() == torch_modules.keys()
    for name, module in torch_modules.items():
        assert type(modules[name]).__mro__[1:] == type(module).__mro__[1:], name
        assert getattr(modules[name], "code", None) == getattr(module, "code", None), name
    assert not unwritten_code(ours)
    assert ours.verifiers == torchs.verifiers
    assert ours.state_dict.keys() == torchs.state_dict.keys()
    for name, tensor in torchs.state_dict.items():
        mine = ours.state_dict[name]
        assert (type(mine), mine.dtype, mine.shape, mine.stride(), mine.requires_grad) == (
            type(tensor),
            tensor.dtype,
            tensor.shape,
            tensor.stride(),
            tensor.requires_grad,
        ), name
        assert torch.equal(mine, tensor), name
    assert ours.constants.keys() == torchs.constants.keys()
    for name, tensor in torchs.constants.items():
        assert torch.equal(ours.constants[name], tensor), name


@pytest.mark.parametrize("name, program", PROGRAMS, ids=lambda value: value if isinstance(value, str) else "")
def test_the_program_torch_reads(name, program, tmp_path):
    path = tmp_path / "model.pt2"
    torch.export.save(program, path)
    ours, torchs = load_exported_program(path), torch.export.load(path)
    _same_program(ours, torchs)
    symbolic = [n.name for n in ours.graph.nodes if _is_symbolic(n.meta.get("val"))]
    assert bool(symbolic) == ("dynamic" in name)  # the symbolic path is exercised where the program has one
    x = torch.randn(3, 3, 8, 8) if "BatchNorm" in name else torch.randn(3, 8) if "cond" in name else None
    if x is not None and ("dynamic" in name or "cond" in name):
        torch.testing.assert_close(ours.module()(x), torchs.module()(x))
        torch.testing.assert_close(ours.module()(-x.abs()), torchs.module()(-x.abs()))


@pytest.mark.parametrize(
    "name, program", PROGRAMS[:3] + PROGRAMS[-2:], ids=lambda value: value if isinstance(value, str) else ""
)
def test_the_quick_path_itself_builds_torchs_program(name, program):
    """quick_deserialize on its own (deserialize would fall back to torch's path were its result not torch's)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass, serialize

    artifact = serialize(program)
    document = json.loads(artifact.exported_program.decode("utf-8"))
    ours = quick_deserialize(program_from_dict(document), artifact.state_dict, artifact.constants)
    torchs = ExportedProgramDeserializer().deserialize(
        _dict_to_dataclass(schema.ExportedProgram, document), artifact.state_dict, artifact.constants, None
    )
    _same_program(ours, torchs)


def _run_graph_module(program, x):
    """The program's own GraphModule called on its lifted state and `x`, as the program's signature orders them."""
    from torch.export.graph_signature import InputKind

    state = {**program.state_dict, **program.constants}
    return program.graph_module(
        *[
            x if spec.kind == InputKind.USER_INPUT else state[spec.target]
            for spec in program.graph_signature.input_specs
        ]
    )


#: Each way of asking a GraphModule for its code (or needing it): what a program read here answers as torch's does.
ASKING = {
    "code": lambda module: module.code,
    "str": str,
    "deepcopy": lambda module: copy.deepcopy(module).code,
    "pickle": lambda module: pickle.loads(pickle.dumps(module)).code,
    "print_readable": lambda module: module.print_readable(print_output=False),
    "forward's signature": lambda module: str(__import__("inspect").signature(module.forward)),
}


@pytest.mark.parametrize("asked", list(ASKING), ids=str)
def test_the_programs_code_is_written_when_first_asked_and_is_torchs(asked, tmp_path):
    path = tmp_path / "model.pt2"
    torch.export.save(PROGRAMS[1][1], path)
    ours, torchs = load_exported_program(path), torch.export.load(path)
    assert "_code" not in vars(ours.graph_module)  # reading wrote no code
    assert ASKING[asked](ours.graph_module) == ASKING[asked](torchs.graph_module)
    assert ours.graph_module.code == torchs.graph_module.code  # a copy leaves its original to write its own
    own_class = vars(type(ours.graph_module))
    assert "_code" in vars(ours.graph_module) and "_code" not in own_class  # written once, then a plain attribute
    assert not any(getattr(value, "deferral", False) for value in own_class.values())


def test_the_programs_graph_module_runs_as_torchs_when_called_before_its_code_was_asked_for(tmp_path):
    path = tmp_path / "model.pt2"
    torch.export.save(PROGRAMS[1][1], path)
    ours, torchs = load_exported_program(path), torch.export.load(path)
    x = torch.randn(2, 3, 8, 8)
    assert "_code" not in vars(ours.graph_module)
    for a, b in zip(_run_graph_module(ours, x), _run_graph_module(torchs, x)):
        assert torch.equal(a, b)
    assert ours.graph_module.code == torchs.graph_module.code


@pytest.mark.parametrize("context", [torch.inference_mode, torch.no_grad])
def test_read_under_inference_mode_or_no_grad_as_torch_reads(context, tmp_path):
    """The fake tensors are made under the caller's grad mode as torch's dispatch makes them
    (inference tensors included)."""
    path = tmp_path / "model.pt2"
    torch.export.save(PROGRAMS[1][1], path)
    with context():
        ours, torchs = load_exported_program(path), torch.export.load(path)
    _same_program(ours, torchs)


def test_a_static_fake_tensor_is_the_one_fake_mode_dispatch_makes():
    """static_fake against torch.empty_strided under the same FakeTensorMode,
    including requires_grad and odd strides."""
    from torch._export.serde import schema
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(
        allow_fallback_kernels=False, allow_non_fake_inputs=True, shape_env=ShapeEnv(assume_static_by_default=True)
    )
    cases = [
        ((2, 3), (3, 1), torch.float32, False, None),
        ((2, 3), (1, 2), torch.bfloat16, True, None),
        ((0, 4), (4, 1), torch.int64, False, None),
        ((), (), torch.float16, True, 0),
        ((5, 1, 7), (7, 99, 1), torch.bool, False, 0),
    ]
    for sizes, strides, dtype, requires_grad, index in cases:
        from torch._export.serde.serialize import _TORCH_TO_SERIALIZE_DTYPE

        meta = schema.TensorMeta(
            dtype=_TORCH_TO_SERIALIZE_DTYPE[dtype],
            sizes=[schema.SymInt.create(as_int=s) for s in sizes],
            requires_grad=requires_grad,
            device=schema.Device(type="cpu", index=index),
            strides=[schema.SymInt.create(as_int=s) for s in strides],
            storage_offset=schema.SymInt.create(as_int=0),
            layout=schema.Layout.Strided,
        )
        with mode:
            device = torch.device("cpu") if index is None else torch.device("cpu", index)
            torchs = torch.empty_strided(sizes, strides, dtype=dtype, device=device, requires_grad=requires_grad)
        ours = static_fake(mode, meta)
        _same_value(ours, torchs, str((sizes, strides, dtype)))
        assert ours.fake_mode is mode
    with mode:  # inside a mode torch's own path is taken
        assert static_fake(mode, meta) is None
    symbolic = schema.TensorMeta(
        dtype=meta.dtype,
        sizes=[schema.SymInt.create(as_expr=schema.SymExpr(expr_str="s0"))],
        requires_grad=False,
        device=meta.device,
        strides=[schema.SymInt.create(as_int=1)],
        storage_offset=meta.storage_offset,
        layout=meta.layout,
    )
    assert static_fake(mode, symbolic) is None
