"""Keep full garbage collections off the requests of a long-lived process that imported torch, TensorFlow or Keras.

Why: those imports leave hundreds of thousands of tracked objects, and every full collection scans all of them:
0.1-0.4 s, landing in whatever request allocated last (a lineage query, a worker's read of a .pt2). Collecting once
and then freezing what is alive (`gc.freeze`) exempts them from later collections. Frozen objects are still freed when
nothing refers to them; only a reference cycle among them outlives its use, so a process settles after it imports a
framework, not after every request.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def settle_heap() -> None:
    """Collect what is garbage now, then exempt every object still alive from later collections."""
    gc.collect()
    gc.freeze()


@contextmanager
def settled_after_imports() -> Iterator[None]:
    """Settle the heap when the block imported modules (the first registration of a framework's model), else do
    nothing. The block's own frames are gone by then, so its cycles are collected, not frozen."""
    modules = len(sys.modules)
    try:
        yield
    finally:
        if len(sys.modules) != modules:
            settle_heap()


@contextmanager
def collections_of_the_block_only() -> Iterator[None]:
    """Within the block, full collections scan only the objects created in it: what was alive before is frozen, and
    unfrozen after. A block that collects again and again (tf2onnx_export: before each of 24 optimizers) in a process
    that imported TensorFlow (some 450,000 objects) otherwise scans them all each time: 6.6 s of a small Keras model's
    7 s export. A process that froze its heap already (the CLI, a worker: settle_heap) is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


__all__ = ["collections_of_the_block_only", "settle_heap", "settled_after_imports"]
