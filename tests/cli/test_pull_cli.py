"""`normbridge pull` and `normbridge export NAME@REF`: a version back from the registry alone,
locally and with --server.

Commands run in-process through Typer's CliRunner against a real SQLite registry (and, for --server, a real
`normbridge serve`); the source file is deleted before anything is pulled or exported.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from typer.testing import CliRunner

from registry.service import Registry
from tests.http_server import create_token, running_server
from tests.registry.test_pull import SAMPLE, trained_cnn


@pytest.fixture
def local(tmp_path):
    db, blobs = f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path / "blobs")
    model = trained_cnn()
    source = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(source))
    Registry(db=db, blobs=blobs, user="test").register("cnn", source)
    source.unlink()
    return {"db": db, "blobs": blobs, "model": model, "args": ["--db", db, "--blobs", blobs]}


def invoke(cli_app, *args: str):
    return CliRunner().invoke(cli_app, list(args), catch_exceptions=False)


def test_pull_writes_the_runnable_pt2_and_says_where(cli_app, local, tmp_path):
    done = invoke(cli_app, "pull", "cnn@1", "-o", str(tmp_path / "back.pt2"), *local["args"], "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert result["format"] == "pt2" and result["path"] == str(tmp_path / "back.pt2")
    with torch.no_grad():
        got = torch.export.load(result["path"]).module()(torch.from_numpy(SAMPLE)).numpy()
        assert np.array_equal(got, local["model"](torch.from_numpy(SAMPLE)).numpy())


def test_pull_refuses_a_format_the_version_is_not_and_names_the_way(cli_app, local, tmp_path):
    done = invoke(cli_app, "pull", "cnn@1", "-o", str(tmp_path / "x.onnx"), "--format", "onnx", *local["args"])
    assert done.exit_code == 14 and "normbridge export cnn@1 --to onnx" in done.output
    assert not (tmp_path / "x.onnx").exists()


def test_an_onnx_version_is_pulled_not_exported_and_every_message_says_so(cli_app, local, tmp_path):
    """export of an ONNX version said 'export_for_serving takes a torch or Keras model' (exit 5), and pull --format pt2
    of it pointed to that same export."""
    source = tmp_path / "cnn.onnx"
    torch.onnx.export(local["model"], (torch.from_numpy(SAMPLE),), str(source), dynamo=False, do_constant_folding=False)
    assert invoke(cli_app, "register", "cnnonnx", str(source), *local["args"]).exit_code == 0
    done = invoke(cli_app, "export", "cnnonnx@1", "--to", "onnx", "-o", str(tmp_path / "served.onnx"), *local["args"])
    assert done.exit_code == 14, done.output
    said = " ".join(done.output.split())
    assert "registered as ONNX" in said and "normbridge pull cnnonnx@1 -o FILE.onnx" in said
    done = invoke(cli_app, "pull", "cnnonnx@1", "-o", str(tmp_path / "x.pt2"), "--format", "pt2", *local["args"])
    assert (
        done.exit_code == 14
        and "given back as onnx or safetensors, not pt2" in " ".join(done.output.split())
        and "export" not in done.output
    )
    done = invoke(cli_app, "export", str(source), "--to", "onnx", "-o", str(tmp_path / "again.onnx"))
    assert (
        done.exit_code == 5
        and "already in the format" in " ".join(done.output.split())
        and "export_for_serving" not in done.output
    )
    assert (
        not (tmp_path / "served.onnx").exists()
        and not (tmp_path / "x.pt2").exists()
        and not (tmp_path / "again.onnx").exists()
    )
    assert invoke(cli_app, "pull", "cnnonnx@1", "-o", str(tmp_path / "back.onnx"), *local["args"]).exit_code == 0
    assert (tmp_path / "back.onnx").read_bytes() == source.read_bytes()


def test_export_for_serving_from_a_registry_whose_source_file_was_deleted(cli_app, local, tmp_path):
    out = tmp_path / "served.onnx"
    done = invoke(cli_app, "export", "cnn@1", "--to", "onnx", "-o", str(out), *local["args"], "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert result["written"] and result["contract"]["passed"]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    served = session.run(None, {session.get_inputs()[0].name: SAMPLE})[0]
    with torch.no_grad():
        expected = local["model"](torch.from_numpy(SAMPLE)).numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_pull_and_export_with_server_and_a_scoped_token(cli_app, local, tmp_path):
    Registry(db=local["db"], blobs=local["blobs"], user="test").register("other", trained_cnn(seed=2))
    token = create_token(local["db"], "cnn-team", "read", models=["cnn"])
    with running_server(db=local["db"], blobs=local["blobs"], log=tmp_path / "serve.log") as server:
        remote = ["--server", server.url, "--token", token]
        done = invoke(cli_app, *remote, "pull", "cnn@1", "-o", str(tmp_path / "remote.pt2"))
        assert done.exit_code == 0, done.output
        done = invoke(
            cli_app, *remote, "export", "cnn@1", "--to", "onnx", "-o", str(tmp_path / "remote.onnx"), "--json"
        )
        assert done.exit_code == 0 and json.loads(done.output)["written"], done.output
        refused = invoke(
            cli_app, *remote, "pull", "other", "-o", str(tmp_path / "other.safetensors"), "--format", "safetensors"
        )
        assert refused.exit_code != 0 and "forbidden" in refused.output
    with torch.no_grad():
        got = torch.export.load(str(tmp_path / "remote.pt2")).module()(torch.from_numpy(SAMPLE)).numpy()
        assert np.array_equal(got, local["model"](torch.from_numpy(SAMPLE)).numpy())
    assert not (tmp_path / "other.safetensors").exists()


def _no_temporary_left(folder) -> bool:
    return not any(path.name.startswith(".") for path in folder.rglob("*"))


def test_outputs_that_cannot_be_written_are_refused_by_name_with_exit_24_and_nothing_left(cli_app, local, tmp_path):
    """A file where a folder goes, a folder where a file goes, an unwritable place: one line naming the path, exit 24
    (was a traceback, exit 1), and an export refuses before it loads the model."""
    blocker = tmp_path / "a_file"
    blocker.write_bytes(b"not a folder")
    (tmp_path / "a_folder").mkdir()
    cases = {
        "pull under a file": (["pull", "cnn@1", "-o", str(blocker / "x.pt2")], "is a file, not a folder"),
        "export under a file": (
            ["export", "cnn@1", "--to", "onnx", "-o", str(blocker / "x.onnx")],
            "is a file, not a folder",
        ),
        "export-layers onto a file": (
            ["export-layers", "cnn@1", "--to", "onnx", "-o", str(blocker)],
            "is a file, and a folder is written there",
        ),
        "export into /proc": (
            ["export", "cnn@1", "--to", "onnx", "-o", "/proc/normbridge-test.onnx"],
            "cannot write '/proc/normbridge-test.onnx'",
        ),
    }
    for name, (args, says) in cases.items():
        done = CliRunner().invoke(cli_app, [*args, *local["args"]])
        assert done.exit_code == 24, (name, done.exit_code, done.output)
        assert "bad_output_path" in done.output and says in " ".join(done.output.split()), (name, done.output)
        assert "Traceback" not in done.output
    assert blocker.read_bytes() == b"not a folder" and _no_temporary_left(tmp_path)


def test_outputs_named_for_another_format_are_refused_before_anything_is_written(cli_app, local, tmp_path):
    pulled = CliRunner().invoke(cli_app, ["pull", "cnn@1", "-o", str(tmp_path / "wrong.onnx"), *local["args"]])
    assert pulled.exit_code == 24 and "written as a .pt2 file" in " ".join(pulled.output.split()), pulled.output
    state = CliRunner().invoke(
        cli_app, ["pull", "cnn@1", "--format", "safetensors", "-o", str(tmp_path / "st.pt2"), *local["args"]]
    )
    assert state.exit_code == 24 and ".safetensors" in state.output
    exported = CliRunner().invoke(
        cli_app, ["export", "cnn@1", "--to", "onnx", "-o", str(tmp_path / "x.txt"), *local["args"]]
    )
    assert exported.exit_code == 2 and f"pass-o{tmp_path / 'x.onnx'}" in re.sub(r"[\s│]", "", exported.output), (
        exported.output
    )
    into_folder = CliRunner().invoke(cli_app, ["export", "cnn@1", "--to", "onnx", "-o", str(tmp_path), *local["args"]])
    assert into_folder.exit_code == 2 and "isafolder" in re.sub(r"[\s│]", "", into_folder.output), into_folder.output
    assert not {"wrong.onnx", "st.pt2", "x.txt"} & {p.name for p in tmp_path.iterdir()} and _no_temporary_left(tmp_path)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="drops to user nobody to meet a folder it may not write"
)
def test_pull_into_a_path_ending_in_a_slash_makes_the_folder_and_a_file_there_or_no_extension_is_named(
    cli_app, local, tmp_path
):
    """'-o d3/' with d3 a file, '-o new/sub/' and '-o /dev/null' all said "'X' ends in ''"."""
    made = CliRunner().invoke(cli_app, ["pull", "cnn@1", "-o", f"{tmp_path / 'new' / 'sub'}/", *local["args"]])
    assert made.exit_code == 0, made.output
    assert (tmp_path / "new" / "sub" / "cnn-1.pt2").is_file()
    (tmp_path / "d3").write_bytes(b"a file")
    blocked = CliRunner().invoke(cli_app, ["pull", "cnn@1", "-o", f"{tmp_path / 'd3'}/", *local["args"]])
    assert blocked.exit_code == 24 and "is a file, and a folder is written there" in " ".join(blocked.output.split()), (
        blocked.output
    )
    assert (tmp_path / "d3").read_bytes() == b"a file"
    for target in ("/dev/null", str(tmp_path / "plain")):
        done = CliRunner().invoke(cli_app, ["pull", "cnn@1", "-o", target, *local["args"]])
        assert done.exit_code == 24 and "has no file extension" in " ".join(done.output.split()), done.output
    assert not (tmp_path / "plain").exists() and _no_temporary_left(tmp_path)


def test_a_folder_the_user_may_not_write_is_named_before_anything_is_written():
    """As user nobody: writing into a read-only folder is refused with an OutputPathError naming that folder, before any
    temporary file. The checkout (and its venv) may be private to its owner, so the very modules `writable` and the
    atomic writer live in (schemas/atomic_io.py and schemas/errors.py, which import nothing else) are copied to a folder
    nobody can read and run by the system's Python; the CLI's exit 24 for that error is the test above's."""
    import schemas

    root = Path(
        tempfile.mkdtemp(prefix="normbridge-nobody-")
    )  # pytest's own folders are 0700: nobody cannot reach them
    try:
        os.chmod(root, 0o755)
        (root / "schemas").mkdir(mode=0o755)
        for name in ("atomic_io.py", "errors.py"):
            shutil.copy(Path(schemas.__file__).parent / name, root / "schemas" / name)
        (root / "schemas" / "__init__.py").write_text("")
        locked = root / "locked"
        locked.mkdir(mode=0o555)
        script = (
            "import sys; from schemas.atomic_io import atomic_write_bytes; from schemas.errors import OutputPathError\n"
            "try:\n    atomic_write_bytes(sys.argv[1], b'model')\nexcept OutputPathError as error:\n    print(error); sys.exit(24)"
        )
        done = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                script,
                str(locked / "y.pt2"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=root,
            env={"PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 24, done.stdout + done.stderr
        assert f"no permission to write in '{locked}'" in done.stdout
        assert list(locked.iterdir()) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_export_of_a_recalibrated_version_does_not_call_its_statistics_unconverged_as_its_verdict_does_not(
    cli_app, tmp_path
):
    """A version registered as recalibrated (`recalibrate --register`, or `register --operation recalibrated`) has
    statistics averaged over its recalibration batches: the registry's servable verdict leaves out
    unconverged_statistics for it, and `export NAME@N` now says the same (it printed the warning). Both versions here
    hold three SGD steps' statistics, which their batch counters call unconverged; only the lineage tells them apart."""
    from tests.registry.test_registry_service import trained_cnn as stepped_cnn

    db, blobs = f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path / "blobs")
    registry = Registry(db=db, blobs=blobs, user="test")
    for module, operation in ((stepped_cnn(seed=0), None), (stepped_cnn(seed=1), "recalibrated")):
        path = tmp_path / "cnn.pt2"
        torch.export.save(torch.export.export(module.eval(), (torch.randn(2, 3, 8, 8),)), str(path))
        registry.register("cnn", path, operation=operation)
    results = {}
    for ref in ("cnn@1", "cnn@2"):
        done = invoke(
            cli_app,
            "export",
            ref,
            "--to",
            "onnx",
            "-o",
            str(tmp_path / f"{ref.replace('@', '-')}.onnx"),
            "--db",
            db,
            "--blobs",
            blobs,
            "--json",
        )
        assert done.exit_code == 0, done.output
        results[ref] = json.loads(done.output)
    assert {h["code"] for h in results["cnn@1"]["hazards"]} >= {"unconverged_statistics"}
    assert "unconverged_statistics" not in {h["code"] for h in results["cnn@2"]["hazards"]}
    assert any(
        note.startswith("unconverged_statistics in ") and "cnn@2 is recalibrated" in note
        for note in results["cnn@2"]["notes"]
    ), results["cnn@2"]["notes"]


@pytest.mark.slow
def test_a_pull_stopped_by_sigterm_leaves_the_old_file_and_no_temporary_one(tmp_path):
    """Python's default SIGTERM ends the process where it stands: a zero-byte '.big.pt2.<hex>.tmp' was left each
    time."""
    import signal
    import time

    from tests.cli_process import normbridge_command

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096), torch.nn.BatchNorm1d(4096), torch.nn.Linear(4096, 2048)
    ).eval()
    source = tmp_path / "big.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 2048),)), str(source))
    db, blobs = f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path / "blobs")
    Registry(db=db, blobs=blobs, user="test").register("big", source)
    out = tmp_path / "out"
    out.mkdir()
    (out / "big.pt2").write_bytes(b"OLD")
    process = subprocess.Popen(
        [*normbridge_command(), "pull", "big@1", "-o", str(out / "big.pt2"), "--db", db, "--blobs", blobs],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not any(p.name.endswith(".tmp") for p in out.iterdir()):
        assert process.poll() is None and time.monotonic() < deadline, (
            "the pull ended before its temporary file was seen"
        )
        time.sleep(0.001)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err.decode()[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["big.pt2"] and (out / "big.pt2").read_bytes() == b"OLD"


def test_pull_of_a_version_that_may_not_serve_says_so(cli_app, local, tmp_path):
    """A guarded alias forced onto a train-mode version gave the file back with no word about it."""
    source = tmp_path / "train.pt2"
    torch.export.save(torch.export.export(trained_cnn().train(), (torch.from_numpy(SAMPLE),)), str(source))
    assert invoke(cli_app, "register", "cnn", str(source), *local["args"]).exit_code == 0
    assert invoke(cli_app, "alias", "cnn", "production", "cnn@2", "--force", *local["args"]).exit_code == 0
    done = invoke(cli_app, "pull", "cnn@production", "-o", str(tmp_path / "prod.pt2"), *local["args"])
    assert done.exit_code == 0 and "not servable" in " ".join(done.output.split()) and "train_mode" in done.output, (
        done.output
    )
    fine = invoke(cli_app, "pull", "cnn@1", "-o", str(tmp_path / "one.pt2"), *local["args"])
    assert fine.exit_code == 0 and "servable" not in fine.output
