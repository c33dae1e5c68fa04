"""Hostile `.pt2` files: nothing stored in one ever runs, in the library, the CLI or the server.

Each attack in `tests.pt2_crafting.HOSTILE` is a genuine torch.export.save archive with one entry
rewritten by zipfile, as an attacker would: a pickle whose unpickling writes a marker file in every
pickle-bearing entry (sample inputs, a use_pickle weight or constant, an opaque or TorchScript
object, a legacy state dict or constants file), and program JSON that torch turns into Python
(a sympy expression, a guard, a node calling aten.from_file or os.system, an input name or a
parameter path that breaks out of FX's generated code), and an AOTInductor library. The control
test proves the live ones do write the marker through torch.export.load; every other test asserts
that normbridge refuses the file with bad_input_file naming the entry (exit 6, HTTP 400), writes
nothing, registers nothing, and that the marker never appears. A genuine archive (buffers,
non-persistent buffers, lifted constants, shared storage, train mode, dynamic shapes) loads to the
same program torch.export.load returns.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from converters.models.loading import load_model
from schemas import InputFileError
from tests.cli_process import normbridge_command
from tests.cli_run import invoke_cli
from tests.http_server import writer_server
from tests.pt2_crafting import HOSTILE, PROGRAM, WEIGHTS_CONFIG, SmallNet, craft, genuine_pt2, root_of

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("inspect", "register", "export", "drift", "contract")


@pytest.fixture(scope="module")
def genuine(tmp_path_factory) -> Path:
    return genuine_pt2(tmp_path_factory.mktemp("genuine") / "model.pt2")


def hostile(name: str, genuine: Path, folder: Path) -> tuple[Path, Path]:
    """(the crafted archive, the marker its payload writes) in `folder`."""
    marker = folder / f"{name}.marker"
    return HOSTILE[name].build(genuine, folder / f"{name}.pt2", marker), marker


# -- the attacks are real ----------------------------------------------------------------------

CONTROL = """
import sys, torch
for path in sys.argv[1:]:
    try:
        program = torch.export.load(path)
        program.module()(torch.randn(2, 3, 8, 8))
    except Exception as error:  # a payload may break the load after it ran: the marker is what counts
        print(path, type(error).__name__, file=sys.stderr)
"""
LIVE = [n for n, h in HOSTILE.items() if h.live_on_torch_load]


@pytest.fixture(scope="module")
def loaded_by_torch(genuine, tmp_path_factory) -> dict[str, Path]:
    """Each live attack's marker after torch.export.load read its archive: one process loads them all, in turn."""
    folder = tmp_path_factory.mktemp("control")
    built = {name: hostile(name, genuine, folder) for name in LIVE}
    subprocess.run(
        [sys.executable, "-c", CONTROL, *(str(path) for path, _ in built.values())],
        capture_output=True,
        timeout=600,
        cwd=folder,
    )
    return {name: marker for name, (_, marker) in built.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", LIVE)
def test_each_live_attack_runs_its_payload_through_torch_export_load(name, loaded_by_torch):
    assert loaded_by_torch[name].exists(), (
        f"torch.export.load no longer runs the '{name}' payload: the attack is not live any "
        "more, update tests/pt2_crafting.py"
    )


# -- the library ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_load_model_refuses_each_attack_naming_the_entry_and_runs_nothing(name, genuine, tmp_path):
    path, marker = hostile(name, genuine, tmp_path)
    try:
        load_model(path)
    except InputFileError as error:
        refused = error
    else:
        refused = None
    assert not marker.exists(), f"the '{name}' payload ran inside load_model"
    assert refused is not None, f"load_model accepted the '{name}' attack"
    assert refused.code == "bad_input_file" and HOSTILE[name].entry in str(refused), str(refused)


def _appended(genuine: Path, out: Path, name: str, data: bytes) -> Path:
    """`genuine` plus one more entry written after the others (zipfile allows a name twice)."""
    out.write_bytes(genuine.read_bytes())
    with zipfile.ZipFile(out, "a") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name: that is the attack
        archive.writestr(root_of(genuine) + name, data)
    return out


def _rewrite_deflated(out: Path, entry: str) -> Path:
    """`out` with `entry` holding 256 MiB of zeros, deflated."""
    with zipfile.ZipFile(out) as source:
        kept = [(info.filename, source.read(info)) for info in source.infolist() if info.filename != entry]
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for name, data in kept:
            target.writestr(name, data)
        info = zipfile.ZipInfo(entry)
        info.compress_type = zipfile.ZIP_DEFLATED
        with target.open(info, "w", force_zip64=True) as stream:
            zeros = bytes(1024**2)
            for _ in range(256):
                stream.write(zeros)
    return out


def _out_of_bounds(document: dict) -> None:
    document["config"]["bn.running_mean"]["tensor_meta"]["sizes"] = [{"as_int": 1000}]


MALFORMED = {
    "duplicate_entry": (lambda g, o: _appended(g, o, PROGRAM, b"{}"), "twice"),
    "path_traversal": (lambda g, o: craft(g, o, replace={"../escape.json": b"{}"}), "'model/../escape.json'"),
    "big_endian": (lambda g, o: craft(g, o, replace={"byteorder": b"big"}), "'byteorder' is 'big'"),
    "view_out_of_bounds": (lambda g, o: craft(g, o, edit_json={WEIGHTS_CONFIG: _out_of_bounds}), "reaches element 999"),
    "not_a_zip": (lambda g, o: o.write_bytes(b"PK\x03\x04 not really a zip") and o, "not a zip file"),
    "deflate_bomb": (
        lambda g, o: _rewrite_deflated(craft(g, o), root_of(g) + "data/sample_inputs/model.pt"),
        "(a zip bomb)",
    ),
    # a bare pickle (not torch.save's zip) the static scanner cannot read: it said "holds a pickle that calls an
    # unreadable pickle"
    "raw_pickle_inputs": (
        lambda g, o: craft(g, o, replace={"data/sample_inputs/model.pt": pickle.dumps(({"x": 1},), protocol=2)}),
        "is not a pickle torch's static scanner can read",
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_archives_are_refused_with_a_message_naming_the_problem(name, genuine, tmp_path):
    build, expected = MALFORMED[name]
    path = build(genuine, tmp_path / f"{name}.pt2")
    with pytest.raises(InputFileError, match=re.escape(expected)):
        load_model(path)


def test_a_genuine_archive_loads_to_the_program_torch_export_load_returns(genuine):
    ours, theirs = load_model(genuine), torch.export.load(str(genuine))
    assert isinstance(ours, torch.export.ExportedProgram)
    assert str(ours.graph) == str(theirs.graph) and str(ours.graph_signature) == str(theirs.graph_signature)
    assert ours.example_inputs is None  # never read: a pickle nothing needs
    for table in ("state_dict", "constants"):
        mine, reference = getattr(ours, table), getattr(theirs, table)
        assert mine.keys() == reference.keys() and mine
        for key in reference:
            assert type(mine[key]) is type(reference[key]) and mine[key].stride() == reference[key].stride(), key
            assert mine[key].requires_grad == reference[key].requires_grad, key
            torch.testing.assert_close(mine[key].detach(), reference[key].detach(), rtol=0, atol=0)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(ours.module()(x), SmallNet()(x), rtol=0, atol=0)


class Everything(torch.nn.Module):
    """Shared storage, a buffer view, an empty parameter, float16 and int64 state, a no_grad region, several norms."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        base = torch.randn(10, 6)
        self.register_buffer("window", base[2:8])  # a view at an offset into a larger storage
        self.register_buffer("transposed", base.t())
        self.register_buffer("scale", torch.rand(6).half(), persistent=False)
        self.ids = torch.tensor([1, 2, 3])  # lifted as a tensor constant
        self.empty = torch.nn.Parameter(torch.empty(0))
        self.linear = torch.nn.Linear(6, 6)
        self.tied = self.linear  # the same parameters under two names
        self.ln, self.rms, self.gn = torch.nn.LayerNorm(6), torch.nn.RMSNorm(6), torch.nn.GroupNorm(2, 4)
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x, y):
        with torch.no_grad():
            z = self.linear(x)
        out = (
            self.rms(self.ln(z + self.tied(x))) @ self.window.t() + self.transposed.sum() + self.scale.float()[:6].sum()
        )
        return out + self.ids.sum() + self.empty.sum(), self.bn(self.gn(y))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_genuine_archives_with_every_kind_of_state_load_like_torch_export_load(mode, tmp_path):
    model = Everything().train(mode == "train")
    batch = torch.export.Dim("batch", min=2, max=64)
    example = (torch.randn(4, 6), torch.randn(4, 4, 5))
    program = torch.export.export(model, example, dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, str(tmp_path / "everything.pt2"))
    ours, theirs = load_model(tmp_path / "everything.pt2"), torch.export.load(str(tmp_path / "everything.pt2"))
    assert str(ours.graph) == str(theirs.graph) and str(ours.range_constraints) == str(theirs.range_constraints)
    assert ours.state_dict.keys() == theirs.state_dict.keys() and ours.constants.keys() == theirs.constants.keys()
    for key, tensor in {**theirs.state_dict, **theirs.constants}.items():
        mine = ours.state_dict.get(key, ours.constants.get(key))
        assert (type(mine), mine.dtype, mine.shape, mine.stride()) == (
            type(tensor),
            tensor.dtype,
            tensor.shape,
            tensor.stride(),
        ), key
        torch.testing.assert_close(mine.detach(), tensor.detach(), rtol=0, atol=0)
    inputs = (torch.randn(7, 6), torch.randn(7, 4, 5))
    torch.testing.assert_close(ours.module()(*inputs), theirs.module()(*inputs), rtol=0, atol=0)


# -- the CLI as a user runs it ------------------------------------------------------------------


def commands_for(name: str) -> tuple[str, ...]:
    """Every model-reading command for an entry attack; for program JSON, inspect (loads) and drift
    (also runs the program)."""
    return ("inspect", "drift") if HOSTILE[name].entry == PROGRAM else COMMANDS


def _cli_arguments(path: Path, folder: Path) -> dict[str, list[str]]:
    """Each model-reading command's arguments on `path`, its outputs under `folder` (which gets the drift inputs)."""
    np.save(folder / "inputs.npy", np.random.default_rng(0).normal(size=(4, 3, 8, 8)).astype(np.float32))
    return {
        "inspect": ["inspect", str(path)],
        "register": ["register", "victim", str(path)],
        "export": ["export", str(path), "-o", str(folder / "served.onnx")],
        "drift": ["drift", str(path), str(folder / "inputs.npy")],
        "contract": ["contract", str(path), str(folder / "served.onnx")],
    }


def _cli_env(folder: Path) -> dict[str, str]:
    return {
        "NORMBRIDGE_DB": f"sqlite:///{folder / 'reg.db'}",
        "NORMBRIDGE_BLOBS": str(folder / "blobs"),
        "COLUMNS": "200",
    }


def _cli_runs(path: Path, folder: Path, commands: tuple[str, ...]) -> dict[str, subprocess.Popen]:
    """The model-reading `commands` started on `path` at once (each a real process); outputs under `folder`."""
    arguments = _cli_arguments(path, folder)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **_cli_env(folder)}
    return {
        command: subprocess.Popen(
            [*normbridge_command(), *arguments[command]],
            cwd=folder,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for command in commands
    }


def _assert_refused_and_nothing_ran(
    name: str, folder: Path, marker: Path, results: dict[str, tuple[str, str, int]]
) -> None:
    """Every command exited 6 naming the entry, the payload never ran, nothing was written or registered."""
    assert not marker.exists(), f"the '{name}' payload ran in one of {sorted(results)}"
    for command, (stdout, stderr, code) in results.items():
        assert code == 6, f"{command}: exit {code}\n{stdout[-2000:]}{stderr[-2000:]}"
        assert "bad_input_file" in stderr and HOSTILE[name].entry in stderr, f"{command}: {stderr[-2000:]}"
    assert not (folder / "served.onnx").exists()
    if (folder / "reg.db").exists():
        from registry.service import Registry

        assert Registry(db=f"sqlite:///{folder / 'reg.db'}", blobs=str(folder / "blobs")).models() == []


#: Attacks also run through real processes (every command at once): the full-unpickler fallback.
#: The others run in-process below.
PROCESS_ATTACKS = ("legacy_state_dict",)


@pytest.mark.slow
@pytest.mark.parametrize("name", PROCESS_ATTACKS)
def test_every_cli_command_as_a_process_refuses_an_attack_with_exit_6_and_runs_nothing(name, genuine, tmp_path):
    path, marker = hostile(name, genuine, tmp_path)
    processes = _cli_runs(path, tmp_path, commands_for(name))
    results = {
        command: (*process.communicate(timeout=600), process.returncode) for command, process in processes.items()
    }
    _assert_refused_and_nothing_ran(name, tmp_path, marker, results)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_cli_command_refuses_each_attack_with_exit_6_and_runs_nothing(name, genuine, tmp_path):
    """The same commands in this process (the console script's app through CliRunner), for every attack."""
    path, marker = hostile(name, genuine, tmp_path)
    arguments = _cli_arguments(path, tmp_path)
    results = {}
    for command in commands_for(name):
        done = invoke_cli(*arguments[command], cwd=tmp_path, env=_cli_env(tmp_path), columns=200)
        results[command] = (done.stdout, done.stderr, done.returncode)
    _assert_refused_and_nothing_ran(name, tmp_path, marker, results)


# -- the server --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with writer_server(tmp_path_factory.mktemp("pt2-server"), "uploader") as (client, db, blobs):
        yield {"client": client, "db": db, "blobs": blobs}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_server_answers_400_to_each_attack_uploaded_as_pt2_and_registers_nothing(name, genuine, server, tmp_path):
    path, marker = hostile(name, genuine, tmp_path)
    model = name.replace("_", "-")
    response = server["client"].post(
        f"/api/v1/models/{model}/versions", params={"format": "pt2"}, content=path.read_bytes()
    )
    assert not marker.exists(), f"the '{name}' payload ran inside normbridge serve"
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_input_file" and HOSTILE[name].entry in error["message"], error
    assert server["client"].get(f"/api/v1/models/{model}/versions").status_code == 404
    assert model not in [m["name"] for m in server["client"].get("/api/v1/models").json()]


@pytest.mark.slow
def test_the_server_still_registers_a_genuine_pt2(genuine, server):
    response = server["client"].post(
        "/api/v1/models/genuine/versions", params={"format": "pt2"}, content=genuine.read_bytes()
    )
    assert response.status_code == 201, response.text
    listed = server["client"].get("/api/v1/models/genuine/versions").json()
    assert [v["number"] for v in listed["versions"]] == [1]
