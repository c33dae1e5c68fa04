"""converters/heap.py's block whose full collections scan only what it creates (the Keras export's 24 collections).

Run in a fresh interpreter: the test processes settle their heap (tests/conftest.py), and the block must behave both
where nothing is frozen (a library user's process) and where the process froze its heap itself (the CLI, a worker).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import gc, json, weakref
    from converters.heap import collections_of_the_block_only

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.b, b.a = b, a
        return a

    alive_before = [cycle() for _ in range(1000)]
    seen = {"frozen_before": gc.get_freeze_count()}
    with collections_of_the_block_only():
        seen["frozen_inside"] = gc.get_freeze_count()
        garbage = cycle()
        gone = weakref.ref(garbage)
        del garbage
        gc.collect()
        seen["block_cycle_freed"] = gone() is None
    seen["frozen_after"] = gc.get_freeze_count()
    gc.freeze()
    frozen = gc.get_freeze_count()
    with collections_of_the_block_only():
        seen["already_frozen_inside_unchanged"] = gc.get_freeze_count() == frozen
    seen["already_frozen_after_unchanged"] = gc.get_freeze_count() == frozen
    print(json.dumps(seen))
""")


def test_the_block_freezes_what_was_alive_collects_its_own_cycles_and_leaves_a_frozen_heap_alone():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["frozen_before"] == 0 and seen["frozen_inside"] >= 2000  # the 1,000 cycles alive before, at least
    assert seen["block_cycle_freed"]  # a cycle made in the block is still collected there
    assert seen["frozen_after"] == 0  # everything unfrozen again: the process's collections as before
    assert seen["already_frozen_inside_unchanged"] and seen["already_frozen_after_unchanged"]
