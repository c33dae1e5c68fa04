"""Imports point down, and no file hides an edge: every import of the project's packages, parsed with `ast`.

The layers, bottom to top: `schemas`; `converters` (on schemas); the registry's store floor (on
schemas); the registry's service floor (on the store floor and converters' public API); `cli` (on
everything). `bench` and `testkit` (helpers shared by the tests and the benchmarks) sit beside `cli`.
Nothing imports `cli`; nothing here imports `tests`. Function-local imports count like any other:
an edge inside a function body is still an edge, only harder to see, so the registry may take
converters only at module top, where its header shows it. A private name (`_x`) belongs to its own
top-level package. No two modules import each other, directly or around a loop; function-local
imports count here too, since moving an import into a function hides a cycle without breaking it. Nor do two packages
inside `converters/` import each other, directly or around a loop (a package with its sub-packages is one room; the
modules at converters' top are the floor they share, not a room).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The packages whose imports are checked.
PACKAGES = ("schemas", "converters", "registry", "cli", "bench", "testkit")
#: Top-level names that belong to the project (an import of any other name is a third-party or stdlib one).
PROJECT = (*PACKAGES, "tests")

#: The registry's store floor: blobs, metadata with its rows and records, the audit chain, leases, tokens,
#: the stored artifact (manifest I/O, tensor blobs), the tar reader, settings. It knows schemas and nothing
#: above: a store that imported converters would load a framework to read a row. Patterns name paths
#: (fnmatch, relative to the repo, `*` crossing folders), so `registry/blobs/` and `registry/entities.py`
#: are placed whether or not they exist yet.
STORE_FLOOR = (
    "registry/__init__.py",
    "registry/settings.py",
    "registry/blobstore*",
    "registry/blobs/*",
    "registry/blob_leases.py",
    "registry/metadata*",
    "registry/entities*",
    "registry/db/*",
    "registry/migrations/*",
    "registry/audit_chain.py",
    "registry/tokens.py",
    "registry/manifest_io*",
    "registry/tensor_blobs.py",
    "registry/streamed_blobs.py",
    "registry/structure.py",
    "registry/state_dict_file.py",
    "registry/tar_reader.py",
    "registry/faults.py",
    "registry/file_modes.py",
)
#: The registry's service floor: the `Registry` service and what it composes (artifact extraction and
#: bundles, the registration gate, diff, lineage, drift records), the HTTP app, the web pages, the
#: HTTP client, the MLflow bridge. It may import the store floor and converters' public API (no module
#: or name starting with `_`), at module top. `bundle_stream` is here because it reads bundles with the
#: artifact module's manifest helpers, and artifact extraction reads models through converters.
SERVICE_FLOOR = (
    "registry/service*",
    "registry/artifact*",
    "registry/bundle_stream*",
    "registry/early_staging.py",
    "registry/coverage.py",
    "registry/recognition_gate.py",
    "registry/diff.py",
    "registry/lineage.py",
    "registry/drift_records.py",
    "registry/drift_history.py",
    "registry/drift_reference.py",
    "registry/drift_status.py",
    "registry/client*",
    "registry/worker_jobs.py",
    "registry/mlflow_bridge.py",
    "registry/mlflow_model.py",
    "registry/mlflow_pt2_pyfunc.py",
    "registry/http/*",
    "registry/web/*",
)

#: layer -> the layers it may import (its own included).
MAY_IMPORT = {
    "schemas": {"schemas"},
    "converters": {"schemas", "converters"},
    "registry store floor": {"schemas", "registry store floor"},
    "registry service floor": {"schemas", "converters", "registry store floor", "registry service floor"},
    "cli": {"schemas", "converters", "registry store floor", "registry service floor", "cli"},
    "bench": {"schemas", "converters", "registry store floor", "registry service floor", "testkit", "bench"},
    "testkit": {"schemas", "converters", "registry store floor", "registry service floor", "testkit"},
}


@dataclass(frozen=True)
class Edge:
    """One imported module (or one name from it) at one line of one file."""

    file: str  # relative to the repo, posix
    line: int
    source: str  # the importing module
    target: str  # the imported module, resolved: the deepest project module the statement names
    names: tuple[str, ...]  # the names of a `from ... import`, empty for `import x`
    local: bool  # inside a function body

    def __str__(self) -> str:
        names = f" ({', '.join(self.names)})" if self.names else ""
        where = " inside a function" if self.local else ""
        return f"{self.file}:{self.line}: imports {self.target}{names}{where}"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from` import names (`from ..x import y` in a.b.c is a.x)."""
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _statements(tree: ast.AST, local: bool = False):
    """Every import statement, with whether it sits in a function body."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, local
        yield from _statements(node, local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def edges_of(path: Path, modules: set[str], root: Path = ROOT) -> list[Edge]:
    """The project modules `path` imports, each resolved to the deepest module the statement names."""
    source, file = module_name(path, root), path.relative_to(root).as_posix()
    is_package = path.name == "__init__.py"
    found = []
    for node, local in _statements(ast.parse(path.read_text(), filename=file)):
        if isinstance(node, ast.Import):
            targets = [(alias.name, ()) for alias in node.names]
        else:
            base = _resolve(source, is_package, node)
            names = tuple(alias.name for alias in node.names)
            # `from pkg import sub` imports the module pkg.sub; `from pkg import name` imports pkg.
            submodules = [f"{base}.{name}" for name in names if f"{base}.{name}" in modules]
            rest = tuple(name for name in names if f"{base}.{name}" not in modules)
            targets = [(sub, ()) for sub in submodules] + ([(base, rest)] if rest or not submodules else [])
        for target, names in targets:
            if target.split(".")[0] in PROJECT:
                found.append(Edge(file, node.lineno, source, target, names, local))
    return found


def project_files(root: Path = ROOT) -> list[Path]:
    return sorted(path for package in PACKAGES for path in (root / package).rglob("*.py"))


FILES = project_files()
MODULES = {module_name(path) for path in FILES}
EDGES = [edge for path in FILES for edge in edges_of(path, MODULES)]


def floors_of(file: str) -> list[str]:
    return [
        name
        for name, patterns in (("registry store floor", STORE_FLOOR), ("registry service floor", SERVICE_FLOOR))
        if any(fnmatch(file, pattern) for pattern in patterns)
    ]


def layer_of_file(file: str) -> str | None:
    """The layer of a file; None for a registry file on no floor or on both
    (test_every_registry_module_is_on_one_floor fails)."""
    top = file.split("/")[0]
    if top != "registry":
        return top
    floors = floors_of(file)
    return floors[0] if len(floors) == 1 else None


def layer_of_module(module: str) -> str | None:
    """The layer of an imported module (`tests` is a layer of its own, which nothing here may import)."""
    top = module.split(".")[0]
    if top != "registry":
        return top
    candidates = [f"{module.replace('.', '/')}.py", f"{module.replace('.', '/')}/__init__.py"]
    existing = [name for name in candidates if (ROOT / name).exists()]
    return layer_of_file(existing[0] if existing else candidates[0])


def _private(edge: Edge) -> bool:
    """A module or name starting with `_` (dunders such as `__version__` are public) belongs to its own package."""
    return any(
        part.startswith("_") and not (part.startswith("__") and part.endswith("__"))
        for part in (*edge.target.split("."), *edge.names)
    )


def test_every_registry_module_is_on_one_floor():
    """A new registry module gets a floor before its imports can be judged."""
    files = [path.relative_to(ROOT).as_posix() for path in FILES if path.relative_to(ROOT).parts[0] == "registry"]
    misplaced = [
        f"{file} is on {'both floors' if floors_of(file) else 'neither floor'}: list it in exactly one of STORE_FLOOR "
        "and SERVICE_FLOOR of tests/test_layering.py"
        for file in files
        if len(floors_of(file)) != 1
    ]
    assert not misplaced, "\n".join(misplaced)


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_imports_point_down(layer):
    broken = [
        f"{edge} ({layer_of_module(edge.target)}), which {layer} may not import"
        for edge in EDGES
        if layer_of_file(edge.file) == layer and layer_of_module(edge.target) not in (*MAY_IMPORT[layer], None)
    ]
    assert not broken, "\n".join(broken)


def test_nothing_imports_cli_and_nothing_imports_tests():
    broken = [
        str(edge)
        for edge in EDGES
        if (edge.target.split(".")[0] == "cli" and not edge.file.startswith("cli/"))
        or edge.target.split(".")[0] == "tests"
    ]
    assert not broken, "\n".join(broken)


def test_the_registry_imports_converters_only_at_module_top():
    """A function-local `import converters...` hides the edge from the file's header (and from the cycle check)."""
    broken = [
        str(edge)
        for edge in EDGES
        if edge.file.startswith("registry/") and edge.target.split(".")[0] == "converters" and edge.local
    ]
    assert not broken, "\n".join(broken)


def test_the_registry_imports_only_converters_public_api():
    broken = [
        str(edge)
        for edge in EDGES
        if edge.file.startswith("registry/") and edge.target.split(".")[0] == "converters" and _private(edge)
    ]
    assert not broken, "\n".join(broken)


def test_no_private_name_crosses_a_top_level_package():
    broken = [str(edge) for edge in EDGES if edge.file.split("/")[0] != edge.target.split(".")[0] and _private(edge)]
    assert not broken, "\n".join(broken)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: every strongly connected component, each sorted, of more than one module or a self-loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_cycles(edges: list[Edge]) -> list[str]:
    """Each cycle among the modules (every import, function-local ones too), with the edges that close it."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    cycles = []
    for component in strongly_connected(graph):
        members = set(component)
        closing = sorted(
            {edge for edge in edges if edge.source in members and edge.target in members},
            key=lambda e: (e.file, e.line, e.target),
        )
        inside = [str(edge) for edge in closing]
        cycles.append(f"cycle among {', '.join(component)}:\n  " + "\n  ".join(inside))
    return cycles


def test_no_import_cycle():
    cycles = import_cycles(EDGES)
    assert not cycles, "\n".join(cycles)


#: Packages above converters: converters may not name a module of theirs, even in a string.
ABOVE_CONVERTERS = ("registry", "cli", "bench", "testkit", "tests")
#: A whole string that is a dotted module name (or its start, "registry."), with a ":function" after it or not.
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\.?(:[A-Za-z_][\w.]*)?")


def names_module_above_converters(value: object) -> bool:
    """Whether a string is the name of a module of a package above converters ("registry.worker_jobs", "registry.")."""
    return (
        isinstance(value, str)
        and _MODULE_NAME.fullmatch(value.strip()) is not None
        and value.strip().split(":")[0].split(".")[0] in ABOVE_CONVERTERS
        and "." in value.split(":")[0]
    )


def _strings(node: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def module_names_written_in_converters(files: list[Path], root: Path = ROOT) -> list[str]:
    """Each string in a converters file that names a module above converters (an `import_module("registry.x")`, a
    "registry." prefix, a module-name constant)."""
    found = []
    for path in files:
        if path.relative_to(root).parts[0] != "converters":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [
            f"{path.relative_to(root).as_posix()}:{node.lineno}: names {node.value!r}"
            for node in _strings(tree)
            if names_module_above_converters(node.value)
        ]
    return found


def _module_constants(files: list[Path], root: Path = ROOT) -> dict[tuple[str, str], str]:
    """(module, name) -> value of every module-level `NAME = "string"` of the project."""
    constants = {}
    for path in files:
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                constants[(module_name(path, root), node.targets[0].id)] = node.value.value
    return constants


def module_names_handed_to_converters(files: list[Path], root: Path = ROOT) -> list[str]:
    """Each call, outside converters, of a converters function (or of a function of a converters module) given a string
    that names a module above converters: written there, or a constant of that file or imported from another."""
    constants = _module_constants(files, root)
    found = []
    for path in files:
        file = path.relative_to(root).as_posix()
        if file.split("/")[0] == "converters":
            continue
        source, tree = module_name(path, root), ast.parse(path.read_text(), filename=file)
        from_converters: set[str] = set()  # local names bound to a converters function or module
        values: dict[str, str] = {name: value for (module, name), value in constants.items() if module == source}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(source, path.name == "__init__.py", node)
                for alias in node.names:
                    local = alias.asname or alias.name
                    if base.split(".")[0] == "converters":
                        from_converters.add(local)
                    elif (base, alias.name) in constants:
                        values[local] = constants[(base, alias.name)]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "converters":
                        from_converters.add((alias.asname or alias.name).split(".")[0])
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            root_name = call.func
            while isinstance(root_name, ast.Attribute):
                root_name = root_name.value
            if not (isinstance(root_name, ast.Name) and root_name.id in from_converters):
                continue
            for argument in [*call.args, *(keyword.value for keyword in call.keywords)]:
                value = values.get(argument.id) if isinstance(argument, ast.Name) else None
                named = [value] if value is not None else [node.value for node in _strings(argument)]
                found += [
                    f"{file}:{call.lineno}: hands {ast.unparse(call.func)} the module name {name!r}"
                    for name in named
                    if names_module_above_converters(name)
                ]
    return found


def test_every_project_import_names_a_module_of_the_project():
    """A moved module leaves no import behind (a function-local `from .x import` fails only when that line runs)."""
    broken = [f"{edge}, which is no module of the project" for edge in EDGES if edge.target not in MODULES]
    assert not broken, "\n".join(broken)


def test_converters_names_no_module_above_it():
    """No edge by name: converters would import what the string names (a worker's jobs, `import_module`),
    unseen above."""
    found = module_names_written_in_converters(FILES) + module_names_handed_to_converters(FILES)
    assert not found, "\n".join(found)


def test_the_parser_sees_module_names_written_in_or_handed_to_converters(tmp_path):
    """The check above finds a literal in converters, and a constant handed to a converters function from above."""
    for folder, text in {
        "converters": "import importlib\nJOBS = 'registry.jobs'\ndef f(jobs):\n    return importlib.import_module('registry.' + jobs)\n"
        "DOC = 'see registry/jobs.py and the registry.jobs module'\n",
        "registry": "from converters.gate import shared_worker\nfrom converters.gate.shared_worker import run_job\n"
        "JOBS_MODULE = 'registry.jobs'\ndef g():\n    run_job(1, jobs=JOBS_MODULE)\n"
        "    shared_worker.start('cli.main')\n    run_job(g)\n",
        "cli": "from registry.jobs import JOBS_MODULE\ndef h():\n    from converters.gate.gates import SharedWorkerGate\n"
        "    return SharedWorkerGate('folder', jobs=JOBS_MODULE)\n",
    }.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "jobs.py").write_text(text)
    files = sorted(tmp_path.rglob("*.py"))
    written = module_names_written_in_converters(files, tmp_path)
    handed = module_names_handed_to_converters(files, tmp_path)
    assert [line.split(": ", 1)[1] for line in written] == ["names 'registry.jobs'", "names 'registry.'"]
    assert [line.split(": ", 1)[1] for line in handed] == [
        "hands SharedWorkerGate the module name 'registry.jobs'",
        "hands run_job the module name 'registry.jobs'",
        "hands shared_worker.start the module name 'cli.main'",
    ]


def test_the_parser_sees_relative_and_function_local_imports(tmp_path):
    """The rules above are only as good as the edges found: relative and function-local edges are found."""
    package = tmp_path / "registry"
    package.mkdir()
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nimport json\nfrom .b import thing\n"
        "if TYPE_CHECKING:\n    from converters.api import convert\n"
        "def f():\n    from converters.onnx_adapter.files import _check\n    import cli.main\n"
    )
    (package / "b.py").write_text("def g():\n    from registry.a import f\n")
    modules = {"registry", "registry.a", "registry.b"}
    edges = [edge for path in sorted(package.glob("*.py")) for edge in edges_of(path, modules, tmp_path)]
    seen = {(edge.source, edge.target, edge.local) for edge in edges}
    assert seen == {
        ("registry", "registry.a", False),
        ("registry.a", "registry.b", False),
        ("registry.a", "converters.api", False),
        ("registry.a", "converters.onnx_adapter.files", True),
        ("registry.a", "cli.main", True),
        ("registry.b", "registry.a", True),
    }
    assert any(_private(edge) for edge in edges)
    assert [cycle.splitlines()[0] for cycle in import_cycles(edges)] == ["cycle among registry.a, registry.b:"]


#: Top-level packages whose sub-packages (each one room, its own sub-packages included) may not import each other around
#: a loop.
ROOMED = ("converters",)


def room_of(module: str, top: str, modules: set[str]) -> str | None:
    """The sub-package of `top` holding `module` (converters.torch_adapter for converters.torch_adapter.pt2.archive);
    None for a module of `top` itself or of another top-level package."""
    parts = module.split(".")
    if parts[0] != top or len(parts) < 2:
        return None
    room = f"{top}.{parts[1]}"
    return room if any(name.startswith(room + ".") for name in modules) else None


def room_loops(edges: list[Edge], top: str, modules: set[str]) -> list[str]:
    """Each loop among the sub-packages of `top` (every import, function-local ones too), with the edges that close
    it."""
    crossing = []
    for edge in edges:
        source, target = room_of(edge.source, top, modules), room_of(edge.target, top, modules)
        if source is not None and target is not None and source != target:
            crossing.append((source, target, edge))
    graph: dict[str, set[str]] = {}
    for source, target, _ in crossing:
        graph.setdefault(source, set()).add(target)
    loops = []
    for component in strongly_connected(graph):
        members = set(component)
        closing = sorted(
            (edge for source, target, edge in crossing if source in members and target in members),
            key=lambda e: (e.file, e.line, e.target),
        )
        loops.append(f"loop among {', '.join(component)}:\n  " + "\n  ".join(str(edge) for edge in closing))
    return loops


@pytest.mark.parametrize("top", ROOMED)
def test_no_two_packages_import_each_other(top):
    """A loop between two rooms makes them one room in two folders: neither can be read, moved or tested without the
    other."""
    loops = room_loops(EDGES, top, MODULES)
    assert not loops, "\n".join(loops)


def test_a_loop_between_packages_is_found_through_a_function_local_import(tmp_path):
    (tmp_path / "converters" / "a" / "inner").mkdir(parents=True)
    (tmp_path / "converters" / "b").mkdir()
    files = {
        "converters/__init__.py": "from .a import x\n",
        "converters/floor.py": "",
        "converters/a/__init__.py": "",
        "converters/a/x.py": "from ..floor import y\n",
        "converters/a/inner/__init__.py": "",
        "converters/a/inner/deep.py": "from ...b import z\n",
        "converters/b/__init__.py": "",
        "converters/b/z.py": "def f():\n    from converters.a import x\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    paths = sorted(tmp_path.rglob("*.py"))
    modules = {module_name(path, tmp_path) for path in paths}
    edges = [edge for path in paths for edge in edges_of(path, modules, tmp_path)]
    loops = room_loops(edges, "converters", modules)
    assert [loop.splitlines()[0] for loop in loops] == ["loop among converters.a, converters.b:"]
    assert "converters/b/z.py:2: imports converters.a.x inside a function" in loops[0]
