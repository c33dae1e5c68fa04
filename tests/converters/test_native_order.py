"""TensorFlow and torch's triton in one process (issue 31): never a segfault, in either import order.

Each case runs in its own interpreter: a SIGSEGV there is a failed test here, not a dead test runner.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

HAS_TRITON = importlib.util.find_spec("triton") is not None
PT2 = """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.bn = torch.nn.BatchNorm2d(4, eps=1e-3)
    def forward(self, x):
        return self.bn(x)
torch.export.save(torch.export.export(M().eval(), (torch.randn(1, 4, 8, 8),)), {path!r})
"""


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


@pytest.fixture(scope="module")
def pt2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pt2")
    path = folder / "bn.pt2"
    subprocess.run([sys.executable, "-c", PT2.format(path=str(path))], check=True, timeout=600)
    return path


def test_keras_imported_by_the_user_then_a_pt2_read(pt2, tmp_path):
    done = _run(
        f"""
        import keras
        import converters
        from converters.native_order import prepare
        print(converters.inspect_model({str(pt2)!r}).layers[0].kind, prepare())
    """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["batch", "kept-out" if HAS_TRITON else "no-triton"]


@pytest.mark.skipif(not HAS_TRITON, reason="torch without triton (a CPU wheel): nothing to keep out")
def test_triton_after_tensorflow_is_a_clear_import_error(tmp_path):
    done = _run(
        """
        import tensorflow
        import converters.torch_adapter
        try:
            import triton
        except ModuleNotFoundError as error:
            print("kept out:", "issue 31" in str(error))
    """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "kept out: True"


@pytest.mark.parametrize("first", ["converters.keras_adapter.runtime.import_keras()", "converters.torch_adapter"])
def test_normbridge_first_then_both_frameworks_in_either_order(pt2, tmp_path, first):
    done = _run(
        f"""
        import converters, converters.keras_adapter.runtime, importlib
        {first if first.endswith(")") else "importlib.import_module(" + repr(first) + ")"}
        import tensorflow, torch._dynamo, sys
        from converters.native_order import prepare
        print(converters.inspect_model({str(pt2)!r}).layers[0].kind, prepare(), "triton" in sys.modules)
    """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["batch", "loaded" if HAS_TRITON else "no-triton", str(HAS_TRITON)]
