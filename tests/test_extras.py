"""Every optional package normbridge imports comes with the extra that its error names (issue 31, item 2).

Three holds: every third-party import of the code is a core dependency or listed in schemas/extras.py; every package
listed there is installed by its extra in pyproject.toml (directly or through another extra it includes); and a command
whose optional package is missing ends in one line naming that extra and the exit code of the error table, never a
traceback (run as a real CLI process with the package hidden from the import system).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from schemas.errors import EXIT_CODES, MissingDependencyError
from schemas.extras import OPTIONAL_MODULES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "converters", "registry", "cli")
#: Top-level module -> the core dependency of pyproject.toml that installs it.
CORE = {
    "numpy": "numpy",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic",
    "safetensors": "safetensors",
    "typer": "typer",
    "click": "typer",
    "rich": "rich",
    "sqlalchemy": "sqlalchemy",
    "alembic": "alembic",
    "httpx": "httpx",
    "ml_dtypes": "ml_dtypes",
}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _installed_by(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """Distributions an extra installs, following normbridge[other] references."""
    names: set[str] = set()
    for requirement in PYPROJECT["project"]["optional-dependencies"][extra]:
        if _name(requirement) == "normbridge":
            for included in re.search(r"\[(.*)\]", requirement).group(1).split(","):
                if included.strip() not in seen:
                    names |= _installed_by(included.strip(), seen | {extra})
        else:
            names.add(_name(requirement))
    return names


def _third_party_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [alias.name for alias in node.names]
                    if isinstance(node, ast.Import)
                    else ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                )
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES and top != "testkit":
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_a_core_dependency_or_comes_with_an_extra():
    unlisted = {
        name: sorted(files)[:3]
        for name, files in _third_party_imports().items()
        if name not in CORE and name not in OPTIONAL_MODULES
    }
    assert not unlisted, (
        f"add these to schemas/extras.py (and their extra in pyproject.toml) or to the core dependencies: {unlisted}"
    )
    core = {_name(requirement) for requirement in PYPROJECT["project"]["dependencies"]}
    assert {distribution.replace("_", "-") for distribution in CORE.values()} <= core


@pytest.mark.parametrize("module", sorted(OPTIONAL_MODULES))
def test_each_optional_package_is_installed_by_the_extra_its_error_names(module):
    extra, distribution = OPTIONAL_MODULES[module]
    assert distribution.replace("_", "-") in _installed_by(extra), (
        f"pyproject.toml's [{extra}] extra does not install {distribution}"
    )


def test_the_keras_and_all_extras_bring_what_exporting_a_keras_model_needs():
    for extra in ("keras", "all"):
        assert {"keras", "tensorflow-cpu", "tf2onnx", "onnx", "onnxruntime"} <= _installed_by(extra)


#: Runs the CLI with `HIDDEN` unimportable, as on a machine without its extra
#: (None in sys.modules: ModuleNotFoundError).
WITHOUT = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from cli.main import main
sys.argv = ["normbridge", *sys.argv[2:]]
main()
"""


def _run_without(hidden: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NORMBRIDGE_HOME": str(cwd / "home"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, hidden, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_exporting_a_keras_model_without_tf2onnx_is_one_line_naming_the_keras_extra(tmp_path):
    import keras

    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Conv2D(2, 1), keras.layers.BatchNormalization()])
    model.save(tmp_path / "m.keras")
    done = _run_without(
        "tf2onnx", "export", str(tmp_path / "m.keras"), "--to", "onnx", "-o", str(tmp_path / "m.onnx"), cwd=tmp_path
    )
    assert done.returncode == EXIT_CODES[MissingDependencyError], done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "missing_dependency" in lines[0] and "'tf2onnx'" in lines[0] and "normbridge[keras]" in lines[0]
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
def test_serving_without_the_server_extra_is_one_line_naming_it(tmp_path):
    done = _run_without("uvicorn", "serve", "--port", "0", cwd=tmp_path)
    assert done.returncode == EXIT_CODES[MissingDependencyError], done.stderr[-2000:]
    assert "normbridge[server]" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_server_without_the_keras_extra_answers_a_keras_upload_with_501_naming_it(tmp_path):
    import httpx
    import keras

    from tests.http_server import create_token, running_server

    hiding = tmp_path / "site"
    hiding.mkdir()
    (hiding / "sitecustomize.py").write_text(
        "import sys\nfor name in ('keras', 'tensorflow'):\n    sys.modules[name] = None\n"
    )
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Conv2D(2, 1), keras.layers.BatchNormalization()])
    model.save(tmp_path / "m.keras")
    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    token = create_token(db, "owner", "write")
    env = {"PYTHONPATH": os.pathsep.join([str(hiding), str(ROOT)])}
    with running_server(db=db, blobs=blobs, env=env, log=tmp_path / "serve.log") as server:
        answer = httpx.post(
            f"{server.url}/api/v1/models/k/versions?format=keras",
            content=(tmp_path / "m.keras").read_bytes(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"},
            timeout=300,
        )
        assert answer.status_code == 501, answer.text
        assert (
            answer.json()["error"]["code"] == "missing_dependency"
            and "normbridge[keras]" in answer.json()["error"]["message"]
        )
        assert httpx.get(f"{server.url}/api/v1/health").status_code == 200  # the server goes on
