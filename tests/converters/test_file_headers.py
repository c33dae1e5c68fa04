"""A file that is not what its suffix says is refused from its first bytes (issue 16 item 12).

A 3 GB file that was not a model was read whole before it was refused. The header checks
(converters/models/file_headers.py) are tested on real files of every format and on near misses;
then the command, as a real process, refuses 3 GB sparse files of every suffix, and the peak
resident memory of that process (getrusage in a wrapper that runs it) stays far below the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from converters.models.file_headers import check_model_header, check_npy_header, check_onnx_header, check_sample_header
from converters.models.loading import load_model
from schemas import InputFileError
from tests.cli_process import normbridge_command
from tests.cli_run import user_environment

BIG = 3 * 2**30
#: Peak RSS allowed to a refusing process: the interpreter, NumPy and the CLI (about 60 MB here); the file is 3 GB.
MAX_RSS_BYTES = 400 * 2**20


def _tiny_onnx() -> onnx.ModelProto:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="test")


def test_real_files_of_every_format_pass(tmp_path):
    onnx.save(_tiny_onnx(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    np.savez(tmp_path / "x.npz", a=np.zeros(3), b=np.ones((1, 2)))
    with zipfile.ZipFile(tmp_path / "m.pt2", "w") as archive:
        archive.writestr("archive/version", "1")
    for path in ("m.onnx", "m.pt2"):
        check_model_header(tmp_path / path)
    for path in ("x.npy", "x.npz"):
        check_sample_header(tmp_path / path)
    assert load_model(tmp_path / "m.onnx").graph.node[0].op_type == "Relu"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: b"", "the file is empty"),
        (lambda data: b"\x00" * 64, "byte 0 does not start a protobuf field"),
        (lambda data: data[:-3], "claims more bytes than the file holds"),
        (lambda data: b"\x0a" + data[1:], "wire type 2"),  # field 1 (ir_version, a varint) as length-delimited
        (
            lambda data: (
                helper.make_model(helper.make_graph([], "g", [], [])).SerializeToString().replace(b"\x3a", b"\x32", 1)
            ),
            "holds no graph",
        ),
    ],
)
def test_onnx_near_misses_are_refused_from_the_header(tmp_path, damage, message):
    path = tmp_path / "bad.onnx"
    path.write_bytes(damage(_tiny_onnx().SerializeToString()))
    with pytest.raises(InputFileError, match=message):
        check_onnx_header(path)


def test_npy_near_misses_are_refused_from_the_header(tmp_path):
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(InputFileError, match="object arrays"):
        check_npy_header(tmp_path / "objects.npy")
    np.save(tmp_path / "full.npy", np.zeros((64, 64), np.float32))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "full.npy").read_bytes()[:500])
    with pytest.raises(InputFileError, match=r"cut off: its header declares float32\[64, 64\] \(16384 bytes\)"):
        check_npy_header(tmp_path / "cut.npy")
    (tmp_path / "text.npy").write_text("1,2,3\n")
    with pytest.raises(InputFileError, match="not a NumPy .npy file"):
        check_npy_header(tmp_path / "text.npy")


def test_a_zip_with_a_broken_end_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "m.keras", "w") as archive:
        archive.writestr("config.json", "{}")
    data = (tmp_path / "m.keras").read_bytes()
    (tmp_path / "cut.keras").write_bytes(data[: len(data) - 30])  # the central directory's end record is gone
    with pytest.raises(InputFileError, match="is not a .keras file"):
        check_model_header(tmp_path / "cut.keras")


# -- the process --------------------------------------------------------------------------------------

#: Runs its arguments as a child and prints the child's exit code, stderr and peak RSS (bytes; Linux reports KiB).
MEASURE = (
    "import json, resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True, stdin=subprocess.DEVNULL)\n"
    "print(json.dumps({'rc': done.returncode, 'stderr': done.stderr, 'peak_rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))\n"
)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """3 GB sparse files (zeros, no disk used) of every suffix, a tiny valid model of each kind, and a sample."""
    folder = tmp_path_factory.mktemp("big")
    for suffix in ("onnx", "pt2", "keras", "npy", "npz"):
        with open(folder / f"big.{suffix}", "wb") as handle:
            handle.truncate(BIG)
    onnx.save(_tiny_onnx(), folder / "tiny.onnx")
    with zipfile.ZipFile(
        folder / "tiny.pt2", "w"
    ) as archive:  # a zip: it passes the header check, so what is refused is the other file
        archive.writestr("archive/version", "1")
    np.save(folder / "sample.npy", np.zeros((2, 1, 2), np.float32))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, refused",
    [
        (("inspect", "big.onnx"), "'big.onnx' is not an ONNX model (byte 0 does not start a protobuf field)"),
        (("inspect", "big.pt2"), "'big.pt2' is not a torch.export .pt2 archive"),
        (("inspect", "big.keras"), "'big.keras' is not a .keras file"),
        (("contract", "tiny.pt2", "big.onnx"), "'big.onnx' is not an ONNX model"),
        (("contract", "tiny.pt2", "tiny.onnx", "--sample", "big.npy"), "'big.npy' is not a NumPy .npy file"),
        (("drift", "tiny.onnx", "big.npz"), "'big.npz' is not a NumPy .npz file"),
        (("recalibrate", "tiny.onnx", "big.npy", "-o", "out.onnx"), "'big.npy' is not a NumPy .npy file"),
        (("export", "big.pt2", "-o", "out.onnx"), "'big.pt2' is not a torch.export .pt2 archive"),
        (
            ("port", "tiny.pt2", "big.keras", "-o", "out.keras"),
            "'big.keras' is not a .keras file",
        ),  # both checked before the source loads
    ],
)
def test_a_3gb_file_that_is_not_a_model_is_refused_without_reading_it(big, args, refused):
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *normbridge_command(), *args],
        cwd=big,
        env=user_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    measured = json.loads(done.stdout)
    assert measured["rc"] == 6, measured["stderr"]
    assert refused in measured["stderr"] and "Traceback" not in measured["stderr"]
    assert measured["peak_rss"] < MAX_RSS_BYTES, (
        f"peak RSS {measured['peak_rss'] / 2**20:.0f} MiB for a refused {BIG / 2**30:.0f} GiB file"
    )
    assert not (big / "out.onnx").exists() and not (big / "out.keras").exists()
