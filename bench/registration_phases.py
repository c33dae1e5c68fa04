"""Where a registration's time per normalizer goes, in one warm process (as the shared worker registers a model).

Registers each model into fresh local stores (`rounds` times after one untimed run, every framework's leg in this
process) with the wall seconds of each step as the registration reports them (`Registration.seconds`): reading the model
into an artifact (the `.pt2` program, its specs, hashes and structure), the gate, staging the blobs and the commit with
publishing. Printed per normalizer as (big model minus small model) / the difference in normalizers, from each model's
fastest run. Timings are printed, never asserted.

    python bench/registration_phases.py   (or from bench/registry.py)
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: (printed label, key of Registration.seconds) of the steps; "whole" is the register call, timed here.
STEPS = (
    ("reading", "reading"),
    ("gate", "gate"),
    ("staging", "staging"),
    ("publish+commit", "commit"),
    ("whole", "whole"),
)


def phase_rows(
    files: dict[str, Path], pairs=(("bn53", "bn1", 52), ("rms160", "rms2", 158)), rounds: int = 3
) -> dict[str, dict[str, float]]:
    """{big model: {step: ms per normalizer}} for each (big, small, extra normalizers) of `pairs`."""
    from registry.service import Registry

    def register(path: Path) -> dict[str, float]:
        folder = Path(tempfile.mkdtemp(prefix="phases-"))
        registry = Registry(db=f"sqlite:///{folder}/registry.db", blobs=str(folder / "blobs"))
        gc.collect()
        start = time.perf_counter()
        done = registry.register("model", str(path))
        whole = time.perf_counter() - start
        registry.meta.close()
        return {**done.seconds, "whole": whole}

    fastest = {}
    for big, small, _ in pairs:
        for name in (small, big):
            register(files[name])  # first-call costs out of the figure
            fastest[name] = min((register(files[name]) for _ in range(rounds)), key=lambda run: run["whole"])
    return {
        big: {label: (fastest[big][key] - fastest[small][key]) * 1000 / extra for label, key in STEPS}
        for big, small, extra in pairs
    }


def print_phase_rows(rows: dict[str, dict[str, float]]) -> None:
    for name, steps in rows.items():
        parts = ", ".join(f"{label} {ms:.1f}" for label, ms in steps.items() if label != "whole")
        print(f"registration per normalizer, warm process, wall: {name} {steps['whole']:.1f} ms ({parts})")


if __name__ == "__main__":
    import torch

    from bench.cold_models import bn_stack, rms_decoder, save_pt2

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        made = {f"bn{n}": save_pt2(bn_stack(n), (torch.randn(2, 3, 16, 16),), folder / f"bn{n}.pt2") for n in (1, 53)}
        made.update(
            {
                f"rms{2 * b}": save_pt2(
                    rms_decoder(b), (torch.zeros(1, 8, dtype=torch.long),), folder / f"rms{2 * b}.pt2"
                )
                for b in (1, 80)
            }
        )
        print_phase_rows(phase_rows(made))
