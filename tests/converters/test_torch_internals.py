"""torch_internals: every private torch access works on the installed torch, and every speed path that uses one falls
back to torch's own path for the same result.

Two kinds of test. The table (`ACCESSES`) runs each access of converters/torch_adapter/torch_internals.py on this torch,
with the public path that replaces it where it has one, compared with the private one. The fallbacks make one fast step
fail for real (the internals function it reaches raises, as it would on a torch that renamed the name) while a genuine
`.pt2` is read, and hold the program read equal to the fast path's, node for node (test_pt2_reading's `_same_program`),
on the archives tests/pt2_crafting.py writes and a transformers Llama.
"""

from __future__ import annotations

import importlib
import io
import logging
import math
import operator
import zipfile

import pytest
import torch
from torch import nn

from converters.torch_adapter import torch_internals as internals
from converters.torch_adapter.pt2.archive import load_exported_program
from schemas.errors import MissingDependencyError
from tests.converters.test_pt2_reading import PROGRAMS, _same_program
from tests.pt2_crafting import genuine_pt2

_FELL_BACK = "own path taken"


def _serialized_document() -> dict:
    import json

    from torch._export.serde.serialize import serialize

    return json.loads(serialize(PROGRAMS[1][1]).exported_program.decode("utf-8"))


def _with_globals() -> None:
    from torch._export.serde.serialize import ExportedProgramDeserializer

    marker = object()
    bound = internals.with_globals(ExportedProgramDeserializer.deserialize, GraphModuleDeserializer=marker)
    assert (
        bound.__globals__["GraphModuleDeserializer"] is marker
        and bound.__code__ is ExportedProgramDeserializer.deserialize.__code__
    )
    with pytest.raises(LookupError):
        internals.with_globals(ExportedProgramDeserializer.deserialize, not_a_name_it_reads=marker)


def _fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = FakeTensorMode()
    fake = internals.fake_tensor(mode, torch.empty(2, 3, device="meta"), torch.device("cpu"))
    assert type(fake) is FakeTensor and fake.fake_mode is mode and internals.is_fake_tensor(fake)
    assert not internals.is_fake_tensor(torch.empty(1))
    assert internals.free_unbacked_symbols_with_path(fake, (), shape_env=None, pending=set()) == {}


def _modes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert internals.modes_active() is False
    with FakeTensorMode():
        assert internals.modes_active() is True


def _dtypes() -> None:
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    assert internals.serialized_dtypes() == {int(k): v for k, v in _SERIALIZE_TO_TORCH_DTYPE.items()}
    # the fallback table (the file format's numbering) is torch's, dtype for dtype
    assert {
        n: getattr(torch, name) for n, name in internals.SCALAR_TYPES.items() if hasattr(torch, name)
    } == internals.serialized_dtypes()


def _own_class() -> None:
    module = torch.fx.symbolic_trace(nn.Linear(2, 2))
    assert internals.graph_module_own_class(module) is type(module)
    with pytest.raises(LookupError):
        internals.graph_module_own_class(nn.Linear(2, 2))


def _deferred_code() -> None:
    """A deferred module writes, on first use, the code torch wrote for its twin; stored_code reads what it holds."""
    linear = nn.Linear(2, 2)
    written, deferred = torch.fx.symbolic_trace(linear), torch.fx.symbolic_trace(linear)
    assert "def forward" in internals.stored_code(written)
    internals.defer_code(deferred, logging.getLogger(__name__))
    assert internals.stored_code(deferred) == ""  # nothing written yet
    x = torch.randn(3, 2)
    assert torch.equal(deferred(x), written(x)) and deferred.code == written.code
    assert internals.stored_code(deferred) == internals.stored_code(written)


def _pytrees() -> None:
    from torch.utils import _pytree

    assert internals.registered_pytree_types() == frozenset(_pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE)
    assert {"builtins.dict", "builtins.tuple", "builtins.list"} <= internals.registered_pytree_types()
    value = ((1, [operator.add, torch.ones(1)]), {"a": slice(None), "b": (math.trunc,)})
    assert internals.tree_leaves(value) == _pytree.tree_leaves(value)
    leaves, spec = _pytree.tree_flatten(((1, 2), {"x": 3}))
    assert internals.tree_unflatten(leaves, spec) == _pytree.tree_unflatten(leaves, spec) == spec.unflatten(leaves)
    assert math.trunc in internals.tree_leaves(value)


def _operators() -> None:
    assert internals.op_overload_class() is torch._ops.OpOverload is type(torch.ops.aten.add.Tensor)
    assert internals.higher_order_operator_class() is torch._ops.HigherOrderOperator
    assert internals.op_schema(torch.ops.aten.add.Tensor).name == "aten::add"
    assert [a.name for a in internals.op_schema(torch.ops.aten.native_batch_norm.default).arguments][:3] == [
        "input",
        "weight",
        "bias",
    ]
    assert internals.op_schema(operator.getitem) is None and internals.op_schema(torch.ops.higher_order.cond) is None
    program = torch.export.export(nn.Sequential(nn.BatchNorm1d(3)).eval(), (torch.ones(2, 3),))
    calls = {node.name: internals.op_name(node) for node in program.graph.nodes}
    assert calls["batch_norm"] == "aten::batch_norm" and calls["input"] is None and calls["output"] is None
    assert internals.op_name(torch.ops.aten.add.Tensor) == "aten::add"
    assert internals.op_name(operator.getitem) is None and internals.op_name(torch.ops.higher_order.cond) is None
    assert internals.op_name(None) is None and internals.op_name(2.0) is None


def _module_classes() -> None:
    assert internals.norm_base_classes() == (torch.nn.modules.batchnorm._NormBase,)
    assert internals.batch_norm_base_classes() == (torch.nn.modules.batchnorm._BatchNorm,)
    assert internals.dropout_base_classes() == (torch.nn.modules.dropout._DropoutNd,)
    bn = nn.BatchNorm2d(3)
    assert internals.own_tensors(bn) == list(bn.parameters(recurse=False)) + list(bn.buffers(recurse=False))
    before = internals.version_counter(bn.weight)
    with torch.no_grad():
        bn.weight.add_(1)
    assert internals.version_counter(bn.weight) == before + 1


def _writer() -> None:
    buffer = io.BytesIO()
    with internals.pt2_archive_writer(buffer) as writer:
        writer.write_bytes("models/x.json", b"{}")
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as zf:
        names = {name.split("/", 1)[1] for name in zf.namelist()}
    assert {"models/x.json", "archive_format", "archive_version", ".data/version"} <= names


#: Each access of torch_internals, run on the installed torch (the name of the function or constant -> its check).
ACCESSES = {
    "import_serializer": lambda: internals.import_serializer().__name__ == internals.SERIALIZE,
    "schema_module": lambda: internals.schema_module().ExportedProgram.__name__ == "ExportedProgram",
    "resolve_schema_class": lambda: internals.resolve_schema_class("Node") is internals.schema_module().Node,
    "union_base": lambda: issubclass(internals.schema_module().Argument, internals.union_base()),
    "union_tag": lambda: str(internals.union_tag("as_int", internals.schema_module().Argument)) == "as_int",
    "dict_to_program": lambda: (
        type(internals.dict_to_program(_serialized_document())) is internals.schema_module().ExportedProgram
    ),
    "reader_schema_version": lambda: (
        internals.reader_schema_version() == tuple(importlib.import_module(internals.SCHEMA).SCHEMA_VERSION)
    ),
    "exported_program_deserializer": lambda: callable(internals.exported_program_deserializer().deserialize),
    "graph_module_deserializer": lambda: callable(internals.graph_module_deserializer().deserialize_tensor_meta),
    "with_globals": _with_globals,
    "free_unbacked_symbols_with_path": _fake_tensors,
    "fake_tensor": _fake_tensors,
    "is_fake_tensor": _fake_tensors,
    "modes_active": _modes,
    "serialized_dtypes": _dtypes,
    "SCALAR_TYPES": _dtypes,
    "graph_module_own_class": _own_class,
    "defer_code": _deferred_code,
    "stored_code": _deferred_code,
    "registered_pytree_types": _pytrees,
    "tree_leaves": _pytrees,
    "tree_unflatten": _pytrees,
    "op_overload_class": _operators,
    "higher_order_operator_class": _operators,
    "op_name": _operators,
    "op_schema": _operators,
    "norm_base_classes": _module_classes,
    "batch_norm_base_classes": _module_classes,
    "dropout_base_classes": _module_classes,
    "own_tensors": _module_classes,
    "version_counter": _module_classes,
    "pt2_archive_writer": _writer,
    "FAKE_TENSOR_LOGGER": lambda: importlib.import_module(internals.FAKE_TENSOR_LOGGER) is not None,
}
_HELPERS = {"fell_back", "torch_version"}


def test_every_access_has_a_row():
    assert set(internals.__all__) - _HELPERS == set(ACCESSES)


@pytest.mark.parametrize("name", sorted(ACCESSES))
def test_each_access_works_on_this_torch(name):
    assert ACCESSES[name]() is not False


# -- public paths taken when a private name is gone --------------------------------------------------------------------


@pytest.fixture
def renamed(monkeypatch):
    """`renamed(module, name)`: torch_internals finds `module.name` gone, as on a torch that renamed it."""
    real = internals._private.__wrapped__
    gone: set[tuple] = set()

    def private(module, name=None, purpose="to read a .pt2 file"):
        if (module, name) in gone:
            raise internals._unavailable(f"'{module}.{name}'", purpose, AttributeError(name))
        return real(module, name, purpose)

    monkeypatch.setattr(internals, "_private", private)
    cached = (internals.serialized_dtypes, internals.op_overload_class, internals.higher_order_operator_class)
    for function in cached:
        function.cache_clear()
    yield lambda module, name: gone.add((module, name))
    for function in cached:
        function.cache_clear()


def test_without_torchs_private_names_their_public_replacements_give_the_same(renamed):
    from torch.utils import _pytree

    expected = (internals.serialized_dtypes(), internals.op_overload_class(), internals.higher_order_operator_class())
    value = ((1, [operator.add, torch.ones(1)]), {"a": slice(None), "b": (2,)})
    leaves, spec = _pytree.tree_flatten(((1, 2), {"x": 3}))
    for module, name in (
        (internals.SERIALIZE, "_SERIALIZE_TO_TORCH_DTYPE"),
        ("torch._ops", "OpOverload"),
        ("torch._ops", "HigherOrderOperator"),
        ("torch.utils._pytree", "tree_leaves"),
        ("torch.utils._pytree", "tree_unflatten"),
        ("torch.utils._pytree", "SERIALIZED_TYPE_TO_PYTHON_TYPE"),
    ):
        renamed(module, name)
    (
        internals.serialized_dtypes.cache_clear(),
        internals.op_overload_class.cache_clear(),
        internals.higher_order_operator_class.cache_clear(),
    )
    assert (
        internals.serialized_dtypes(),
        internals.op_overload_class(),
        internals.higher_order_operator_class(),
    ) == expected
    assert _callables(internals.tree_leaves(value)) == _callables(_pytree.tree_leaves(value)) == [operator.add]
    for _, program in PROGRAMS:  # what pt2/program_checks.check_graph walks: every node's arguments
        for node in program.graph.nodes:
            arguments = (node.args, node.kwargs)
            assert _callables(internals.tree_leaves(arguments)) == _callables(_pytree.tree_leaves(arguments)), node.name
    assert internals.tree_unflatten(leaves, spec) == ((1, 2), {"x": 3})
    assert internals.registered_pytree_types() is None  # pt2/treespecs.py then rewrites nothing


def _callables(leaves: list) -> list:
    """The leaves pt2/program_checks.check_graph looks at (map_aggregate also opens slices, whose parts are never
    callables)."""
    return [leaf for leaf in leaves if callable(leaf) and not isinstance(leaf, torch.fx.Node)]


def test_the_module_classes_public_fallbacks_are_every_stock_subclass_of_the_private_ones(monkeypatch):
    private = (
        torch.nn.modules.batchnorm._NormBase,
        torch.nn.modules.batchnorm._BatchNorm,
        torch.nn.modules.dropout._DropoutNd,
    )
    publics = []
    for function in (internals.norm_base_classes, internals.batch_norm_base_classes, internals.dropout_base_classes):
        monkeypatch.setattr(
            torch.nn.modules.batchnorm, "_NormBase", None
        )  # as on a torch without them: the public lists
        monkeypatch.setattr(torch.nn.modules.batchnorm, "_BatchNorm", None)
        monkeypatch.setattr(torch.nn.modules.dropout, "_DropoutNd", None)
        function.cache_clear()
        publics.append(function())
        monkeypatch.undo()
        function.cache_clear()
    for base, classes in zip(private, publics):
        stock = {c for c in vars(nn).values() if isinstance(c, type) and issubclass(c, base) and c is not base}
        assert stock == set(classes), base.__name__


def test_the_archive_writers_fallback_writes_torchs_bytes(monkeypatch):
    def write(writer_of):
        buffer = io.BytesIO()
        with writer_of(buffer) as writer:
            writer.write_bytes("models/model.json", b'{"a": 1}')
            writer.archive_file.write_record("data/weights/weight_0", torch.arange(6.0).untyped_storage(), 24)
        return buffer.getvalue()

    assert write(internals._FileWriterArchive) == write(internals.pt2_archive_writer)


def test_a_torch_without_the_deserializer_is_named_not_blamed_on_the_file(tmp_path, monkeypatch):
    """Nothing replaces torch's own deserializer: its absence is a missing dependency naming this torch,
    never 'the archive is malformed'."""
    path = genuine_pt2(tmp_path / "model.pt2")

    def gone():
        raise internals._unavailable(
            f"'{internals.SERIALIZE}.ExportedProgramDeserializer'", "to read a .pt2 file", AttributeError("x")
        )

    monkeypatch.setattr(internals, "exported_program_deserializer", gone)
    with pytest.raises(
        MissingDependencyError, match=rf"torch {internals.torch_version()} has no .*ExportedProgramDeserializer"
    ):
        load_exported_program(path)


# -- the speed paths fall back to torch's own, for the same program ----------------------------------------------------

#: Each fast step of reading a .pt2, made to fail: the internals function it reaches
#: (-> the step named in the debug line).
FAST_STEPS = {
    "schema conversion": ("schema_module", "the program's schema conversion"),
    "patched deserializer": ("graph_module_deserializer", "the program's deserialization"),
    "static fake tensors": ("fake_tensor", "a static fake tensor"),
    "unbacked-symbol shortcut": ("is_fake_tensor", "the unbacked-symbol shortcut"),
    "deferred code": ("graph_module_own_class", "the deferred code"),
}
#: Genuine archives: pt2_crafting's SmallNet, a dynamic batch (symbolic sizes), a transformers Llama, an unbacked size.
READ = ("SmallNet", "train BatchNorm, dynamic batch", "transformers Llama", "dynamic rows from nonzero (unbacked)")


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pt2")
    paths = {"SmallNet": genuine_pt2(folder / "smallnet.pt2")}
    for name, program in PROGRAMS:
        if name in READ:
            paths[name] = folder / f"{len(paths)}.pt2"
            torch.export.save(program, paths[name])
    return paths


def _read_quietly_checked(path, caplog) -> object:
    """The program read from `path` by the fast path alone (no fallback logged)."""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="converters.torch_adapter"):
        program = load_exported_program(path)
    assert not [r.getMessage() for r in caplog.records if _FELL_BACK in r.getMessage()]
    return program


@pytest.mark.parametrize("archive", READ)
@pytest.mark.parametrize("step", list(FAST_STEPS))
def test_a_failing_fast_step_falls_back_to_torchs_for_the_same_program(step, archive, archives, monkeypatch, caplog):
    fast = _read_quietly_checked(archives[archive], caplog)
    name, logged = FAST_STEPS[step]

    def fails(*args, **kwargs):
        raise AttributeError(f"torch_internals.{name} made to fail")

    monkeypatch.setattr(internals, name, fails)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="converters.torch_adapter"):
        fallen = load_exported_program(archives[archive])
    lines = [r.getMessage() for r in caplog.records if _FELL_BACK in r.getMessage()]
    assert lines and all(line.startswith(logged) and "\n" not in line for line in lines), lines
    monkeypatch.undo()
    _same_program(fallen, fast)


def test_every_speed_path_keeps_its_fallback_test():
    assert {name for name, _ in FAST_STEPS.values()} == {
        "schema_module",
        "graph_module_deserializer",
        "fake_tensor",
        "is_fake_tensor",
        "graph_module_own_class",
    }
