"""TensorFlow and triton in one process: load triton's native library first, or not at all (issue 31).

Why: TensorFlow's Linux wheels (2.19.1 to 2.21.0 at least) load `_pywrap_tensorflow_internal.so` with RTLD_GLOBAL
(tensorflow/python/pywrap_dlopen_global_flags.py), which puts the LLVM and MLIR statically linked into
libtensorflow_framework.so.2 and libtensorflow_cc.so.2 in the process's global symbol scope. triton's libtriton.so
(triton 3.7+, which torch's CUDA wheels bring) carries its own LLVM, exported and interposable; loaded after TensorFlow,
about 12,700 of its LLVM/MLIR references bind to TensorFlow's copies of another LLVM revision, and its static
initializers crash the process in dlopen (SIGSEGV in `_GLOBAL__sub_I_PassBuilder.cpp`: `llvm::DebugCounter::instance()`
is TensorFlow's). torch imports triton on `import torch._dynamo` (torch/_dynamo/utils.py, `has_triton_package()`),
which reading a .pt2, ShapeEnv() and torch.onnx.export(dynamo=True) all reach. Loaded first, libtriton binds to
itself (Python dlopens with RTLD_NOW) and TensorFlow, loaded after, cannot change that.

`prepare()` runs before normbridge imports TensorFlow (keras_adapter/runtime.py) and before any torch module that
reaches torch._dynamo (torch_adapter/__init__.py):
  - triton not installed (torch's CPU wheels), or libtriton loaded already: nothing to do;
  - TensorFlow's native library not loaded yet: libtriton is loaded now, as Python would (RTLD_NOW | RTLD_LOCAL,
    ~30 ms; its Python package is not imported);
  - TensorFlow loaded first (a program that imported it before normbridge) and libtriton not: loading libtriton would
    crash, so `triton` is made a missing module for this process, with a message that says why: torch then runs as on
    its CPU wheels (has_triton_package() is False), which normbridge supports, and a later `import triton` raises
    ModuleNotFoundError instead of a segfault.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.abc
import importlib.util
import os
import sys
import threading

#: The module whose load puts TensorFlow's LLVM in the global scope.
TF_NATIVE = "tensorflow.python._pywrap_tensorflow_internal"

_lock = threading.Lock()
_state: str | None = None


def _libtriton() -> str | None:
    spec = importlib.util.find_spec("triton")  # a top-level package: located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "_C", "libtriton*.so")))
        if found:
            return found[0]
    return None


def _global_llvm() -> bool:
    """Whether an LLVM is exported in the global scope (TensorFlow's, or any other loaded with RTLD_GLOBAL)."""
    return hasattr(ctypes.CDLL(None), "_ZN4llvm12DebugCounter8instanceEv")


def _loaded(path: str) -> bool:
    try:
        ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_NOLOAD)
    except OSError:
        return False
    return True


class TritonAfterTensorFlow(importlib.abc.MetaPathFinder):
    """`triton` as a missing module: in this process TensorFlow was loaded first, and libtriton would crash it."""

    MESSAGE = (
        "triton is kept out of this process: TensorFlow was imported before it, and libtriton's LLVM would bind "
        "to TensorFlow's and crash (SIGSEGV; normbridge issue 31). Import torch._dynamo (or triton, or "
        "normbridge's torch or keras adapter) before tensorflow/keras, or use a process per framework."
    )

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(self.MESSAGE, name=name)
        return None


def prepare() -> str:
    """Make this process safe for TensorFlow and torch's triton together; returns what it did."""
    global _state
    with _lock:
        if _state in ("no-triton", "loaded", "kept-out"):
            return _state
        path = _libtriton()
        if path is None:
            _state = "no-triton"
        elif _loaded(path):
            _state = "loaded"
        elif TF_NATIVE not in sys.modules and not _global_llvm():
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
            _state = "loaded"
        else:
            sys.meta_path.insert(0, TritonAfterTensorFlow())
            _state = "kept-out"
        return _state
