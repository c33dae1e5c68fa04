"""Benchmark: registering models as users do, in cold processes, beside MLflow, in one run (issue 15).

- `normbridge register` of a .pt2 with 53 BatchNorm2d(64) (ResNet-50's count) and of keras
  ResNet50 (weights=None) as .keras, each beside MLflow's `log_model` + `register_model` of the same
  model in a fresh process (the ratio: target <= 0.5x);
- the gate's marginal cost per normalizer: (53-layer minus 1-layer) / 52 of the gate step the cold runs' registrations
  reported (`register --json` prints each step's seconds), the same for a Llama-style decoder with 160 RMSNorms (minus
  its 2-norm, 1-block version) / 158 (target <= 5 ms), and the same difference of the gate's own CPU measured in this
  process with all three legs here (no second process: what one core pays); beside them, the whole registration's
  marginal cost (reading the bigger program, the gate, storing its tensors) from the same runs' wall and CPU;
- where a registration's time per normalizer goes in a warm process (bench/registration_phases.py: reading, gate,
  staging, commit), and reading the .pt2 per normalizer beside a bare torch.export.load;
- peak memory of registering a large .pt2 checkpoint above the process's baseline after its imports
  (target <= 300 MB for 1 GB), beside the same for the 1-BatchNorm model: what any registration costs
  (the gate's own imports and work), so the difference is what the checkpoint's size adds;
- bytes stored by a statistics-only fine-tune versus a full copy, and a lineage query over a
  1,000-version chain (issue 4: < 1%, < 50 ms).

Medians of --repeat cold processes; the machine's load average is printed with the table, since other
processes sharing the cores slow every row. Timings are printed, never asserted by a test.

    python bench/registry.py [--repeat 3] [--megabytes 1000] [--skip-memory] [--gate-only]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.cold import (
    ENV,
    MLFLOW_KERAS,
    MLFLOW_TORCH,
    MlflowStores,
    NormbridgeStores,
    SharedWorkers,
    Timing,
    median_seconds,
    normbridge,
)  # noqa: E402
from bench.cold_models import bn_stack, rms_decoder, save_pt2, write_models  # noqa: E402
from bench.registration_phases import phase_rows, print_phase_rows  # noqa: E402

#: Registers a .pt2 in this fresh process after its imports, then prints baseline and peak resident memory (kB).
MEMORY_PROBE = """
import sys
import converters.models.artifact, registry.service, torch  # the imports a registration makes before reading the model
from registry.service import Registry

def kb(field):
    return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1])

baseline = kb("VmRSS:")
Registry(db=f"sqlite:///{sys.argv[2]}/registry.db", blobs=f"{sys.argv[2]}/blobs").register("big", sys.argv[1])
print(baseline, kb("VmHWM:"))
"""


#: (model, with no worker alive) of the cold registration rows; `--cold-only` keeps the first two models' rows.
ROWS = (
    ("bn53", True),
    ("bn53", False),
    ("resnet50", True),
    ("resnet50", False),
    ("bn1", False),
    ("rms2", False),
    ("rms160", False),
)


#: (normalizer, the bigger model's cold rows, the smaller model's, the normalizers it has more) of the per-normalizer
#: figures.
MARGINAL_PAIRS = (
    ("BatchNorm", "register bn53", "register bn1", 52),
    ("RMSNorm", "register rms160", "register rms2", 158),
)


def cold_registration_rows(files: dict[str, Path], folder: Path, repeat: int, rows=ROWS) -> dict[str, Timing]:
    stores, mlflow, workers = NormbridgeStores(folder), MlflowStores(folder), SharedWorkers(folder / "workers")
    seconds = {}
    for name, cold in rows:
        label = f"register {name}" + (" cold worker" if cold else "")
        seconds[label] = workers.median(
            lambda i, name=name: normbridge("register", name, str(files[name]), "--json"),
            repeat,
            lambda i, name=name, label=label: stores.fresh(f"{label}-{i}".replace(" ", "-")),
            cold,
        )
        print(f"  {label}: {seconds[label]}", flush=True)
    workers.stop()
    seconds["mlflow bn53"] = median_seconds(
        lambda i: [sys.executable, "-c", MLFLOW_TORCH, str(mlflow.fresh(f"bn53-{i}")), str(files["bn53_state"]), "53"],
        repeat,
    )
    print(f"  mlflow bn53: {seconds['mlflow bn53']}", flush=True)
    seconds["mlflow resnet50"] = median_seconds(
        lambda i: [sys.executable, "-c", MLFLOW_KERAS, str(mlflow.fresh(f"resnet50-{i}")), str(files["resnet50"])],
        repeat,
    )
    print(f"  mlflow resnet50: {seconds['mlflow resnet50']}", flush=True)
    return seconds


def gate_cpu_per_normalizer(big: Path, small: Path, rounds: int = 3) -> tuple[int, int, float, float]:
    """(normalizers of `big`, of `small`, the gate's marginal CPU ms per normalizer, the same for `check` one normalizer
    at a time): (CPU on `big` minus CPU on `small`) / the difference in normalizers, every leg in this process (torch,
    keras, onnx), the least of `rounds` runs each, after a first run that pays the imports and first-call costs."""
    from converters import check
    from converters.gate.split_check import SplitCheck
    from registry.artifact import extract_artifact

    specs = {path: list(extract_artifact(path).specs) for path in (big, small)}
    ways = {
        "gate": SplitCheck(in_worker=[]).check_all,
        "check": lambda model_specs: [check(spec) for spec in model_specs],
    }
    least = {(way, path): float("inf") for way in ways for path in specs}
    for way in ways.values():
        way(specs[small])  # first-call costs (imports, kernels) out of the figure
    for _ in range(rounds):
        for way, path in least:
            start = time.process_time()
            ways[way](specs[path])
            least[(way, path)] = min(least[(way, path)], time.process_time() - start)
    extra = len(specs[big]) - len(specs[small])
    return (
        len(specs[big]),
        len(specs[small]),
        *((least[(way, big)] - least[(way, small)]) * 1000 / extra for way in ways),
    )


def gate_rows(folder: Path, files: dict[str, Path] | None = None) -> dict[str, tuple[int, int, float, float]]:
    """The gate's marginal CPU per normalizer on the 53-BatchNorm model (minus its 1-layer version) and the 160-RMSNorm
    decoder (minus its 2-norm version); the .pt2 files are written into `folder` unless `files` has them."""
    files = {} if files is None else files  # the caller's dict gets the paths of the files written here
    for n in (1, 53):
        files.setdefault(f"bn{n}", folder / f"bn{n}.pt2")
        if not files[f"bn{n}"].exists():
            save_pt2(bn_stack(n), (torch.randn(2, 3, 16, 16),), files[f"bn{n}"])
    for blocks in (1, 80):
        files.setdefault(f"rms{2 * blocks}", folder / f"rms{2 * blocks}.pt2")
        if not files[f"rms{2 * blocks}"].exists():
            save_pt2(rms_decoder(blocks), (torch.zeros(1, 8, dtype=torch.long),), files[f"rms{2 * blocks}"])
    return {
        big: gate_cpu_per_normalizer(files[big], files[small]) for big, small in (("bn53", "bn1"), ("rms160", "rms2"))
    }


def print_gate_rows(gate: dict[str, tuple[int, int, float, float]]) -> None:
    for name, (count, baseline, ms, one_by_one) in gate.items():
        print(
            f"gate per normalizer, CPU in one process, all three legs (no second process): {name} {ms:.1f} ms over {count - baseline} "
            f"more than its {baseline}-normalizer version (check one normalizer at a time: {one_by_one:.1f} ms)"
        )


def reading_per_normalizer(big: Path, small: Path, extra: int, rounds: int = 3) -> tuple[float, float]:
    """(torch.export.load, normbridge's reader) ms per normalizer: (least time of `big` minus least of `small`) /
    `extra`, warm, in this process. What any tool pays to hold the bigger program before it can look at it
    (torch.export.load unpickles the sample inputs: fine for these files, which this run wrote)."""
    from converters.torch_adapter.pt2.archive import load_exported_program

    least = {}
    for way, load in (("torch", lambda path: torch.export.load(str(path))), ("normbridge", load_exported_program)):
        for path in (small, big):
            load(path)
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                load(path)
                times.append(time.perf_counter() - start)
            least[(way, path)] = min(times)
    return tuple((least[(way, big)] - least[(way, small)]) * 1000 / extra for way in ("torch", "normbridge"))


def reading_rows(files: dict[str, Path]) -> dict[str, tuple[float, float]]:
    """{label: (torch.export.load, normbridge's reader) ms per normalizer} of the two model pairs
    (the files must still exist)."""
    return {
        label: reading_per_normalizer(files[big], files[small], extra)
        for label, big, small, extra in (("BatchNorm", "bn53", "bn1", 52), ("RMSNorm", "rms160", "rms2", 158))
    }


def print_reading_rows(rows: dict[str, tuple[float, float]]) -> None:
    for label, (bare, ours) in rows.items():
        print(
            f"reading the .pt2 per normalizer, warm: {label} torch.export.load {bare:.1f} ms, normbridge's reader {ours:.1f} ms "
            f"({ours / bare:.2f}x)"
        )


def probe_peak_mb(path: Path, store: Path) -> float:
    """Peak MB above the baseline after imports of registering `path` in a fresh process (MEMORY_PROBE)."""
    store.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(path), str(store)],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    baseline, peak = (int(v) for v in done.stdout.split()[-2:])
    return (peak - baseline) / 1024


def peak_memory_mb(megabytes: int, folder: Path) -> tuple[float, float]:
    """(checkpoint MB, peak MB above the baseline after imports) of registering an MLP .pt2 of about `megabytes` MB
    (Linear(2048, 2048) + BatchNorm1d blocks, as bench/pull.py's checkpoint)."""
    width = 2048
    blocks = max(1, round(megabytes * 1e6 / (4 * width * width)))
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).eval()
    path = save_pt2(model, (torch.randn(2, width),), folder / "big.pt2")
    size = sum(t.nbytes for t in model.state_dict().values()) / 1e6
    del model, layers
    return size, probe_peak_mb(path, folder / "big-store")


#: Lineage queries timed one by one (median and max printed).
LINEAGE_CALLS = 21


def stats_only_and_lineage(
    folder: Path, chain: int, calls: int = LINEAGE_CALLS
) -> tuple[int, int, tuple[float, float]]:
    """(bytes a statistics-only fine-tune stored, full checkpoint bytes, (median, max) seconds of `calls` lineage
    queries of the middle of a `chain` chain). Why median and max, not a mean of a few: in this process (torch imported)
    a full garbage collection takes about 0.1 s and lands in one call of five to ten, whichever it is; the median is a
    query's own time, the max says what such a pause adds."""
    from registry.artifact import extract_artifact
    from registry.service import Registry

    registry = Registry(db=f"sqlite:///{folder}/warm.db", blobs=str(folder / "warm-blobs"))
    model = rms_decoder(8)
    registry.register("ckpt", model)
    size = sum(int(t.nbytes) for t in model.state_dict().values())
    before = sum(p.stat().st_size for p in (folder / "warm-blobs").rglob("*") if p.is_file())
    with torch.no_grad():
        model.layers[0].input_layernorm.weight.mul_(1.01)  # one normalizer's scale moved, nothing else
    registry.register("ckpt", model, note="one norm fine-tuned")
    stored = sum(p.stat().st_size for p in (folder / "warm-blobs").rglob("*") if p.is_file()) - before
    manifest = extract_artifact(rms_decoder(1)).manifest.model_dump(mode="json")
    parent = None
    for number in range(1, chain + 1):
        record, _ = registry.meta.add_version(
            "chain", f"digest-{number}", f"content-{number}", manifest, [], parent, "fine-tuned", None, "bench"
        )
        parent = ("chain", record.number)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        registry.lineage(f"chain@{chain // 2}")
        seconds.append(time.perf_counter() - start)
    return stored, size, (statistics.median(seconds), max(seconds))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--megabytes", type=int, default=1000, help="size of the checkpoint whose peak memory is measured"
    )
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--cold-only", action="store_true", help="only the cold registrations beside MLflow (while iterating)"
    )
    parser.add_argument("--chain", type=int, default=1000)
    parser.add_argument(
        "--gate-only", action="store_true", help="print only the gate's per-normalizer rows (no cold processes)"
    )
    args = parser.parse_args()
    if args.gate_only:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
            files: dict[str, Path] = {}
            print_gate_rows(gate_rows(Path(tmp), files))
            print_reading_rows(reading_rows(files))
            print_phase_rows(phase_rows(files))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("writing the models ...", flush=True)
        files = write_models(folder)
        files["rms2"] = save_pt2(rms_decoder(1), (torch.zeros(1, 8, dtype=torch.long),), folder / "rms2.pt2")
        load = os.getloadavg()[0]
        seconds = cold_registration_rows(files, folder, args.repeat, ROWS[:4] if args.cold_only else ROWS)
        reading_files = dict(files)
        gate = {} if args.cold_only else gate_rows(folder, reading_files)
        phases = {} if args.cold_only else phase_rows(reading_files)
        reading = {} if args.cold_only else reading_rows(reading_files)
        memory = (
            None
            if args.skip_memory or args.cold_only
            else (*peak_memory_mb(args.megabytes, folder), probe_peak_mb(files["bn1"], folder / "bn1-store"))
        )
        stored, size, lineage = (None, None, None) if args.cold_only else stats_only_and_lineage(folder, args.chain)
    print(
        f"\nregistry benchmark, cold processes, median of {args.repeat}; load average {load:.1f} -> {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores"
    )
    print(
        "normbridge's CPU includes the shared gate worker's and its second process's; 'worker warm': earlier registrations left it and its second process running, idle, 'first': none was"
    )
    print(f"{'model':<42} {'normbridge register':>24} {'mlflow log+register':>24} {'ratio wall / cpu':>17}")
    print(f"{'':<42} {'wall s':>11} {'cpu s':>12} {'wall s':>11} {'cpu s':>12}")
    for label, ours, theirs in (
        ("torch 53x BatchNorm2d(64) .pt2, worker warm", "register bn53", "mlflow bn53"),
        ("torch 53x BatchNorm2d(64) .pt2, first", "register bn53 cold worker", "mlflow bn53"),
        ("keras ResNet50 .keras, worker warm", "register resnet50", "mlflow resnet50"),
        ("keras ResNet50 .keras, first", "register resnet50 cold worker", "mlflow resnet50"),
    ):
        a, b = seconds[ours], seconds[theirs]
        print(
            f"{label:<42} {a.wall:>11.2f} {a.cpu:>12.2f} {b.wall:>11.2f} {b.cpu:>12.2f} {a.wall / b.wall:>7.2f}x / {a.cpu / b.cpu:.2f}x"
            "  (target <= 0.5x)"
        )
    if args.cold_only:
        return 0
    for label, name in (
        ("torch 1x BatchNorm2d(64) .pt2", "register bn1"),
        ("decoder 2x RMSNorm (1 block) .pt2", "register rms2"),
        ("decoder 160x RMSNorm .pt2", "register rms160"),
    ):
        print(f"{label + ', worker warm':<42} {seconds[name].wall:>11.2f} {seconds[name].cpu:>12.2f}")
    print()
    for label, big, small, extra in MARGINAL_PAIRS:
        wall = (seconds[big].wall - seconds[small].wall) / extra * 1000
        cpu = (seconds[big].cpu - seconds[small].cpu) / extra * 1000
        print(
            f"registration per normalizer, cold CLI (reading, gate and storing): {label} {wall:.1f} ms wall, {cpu:.1f} ms CPU "
            f"(both processes) over {extra} more"
        )
    for label, big, small, extra in MARGINAL_PAIRS:
        steps = {
            step: (seconds[big].steps[step] - seconds[small].steps[step]) / extra * 1000 for step in seconds[big].steps
        }
        print(
            f"gate per normalizer, cold CLI (the gate step the registrations reported, wall): {label} {steps['gate']:.1f} ms over {extra} "
            f"more (target <= 5 ms; the other steps: reading {steps['reading']:.1f}, staging {steps['staging']:.1f}, "
            f"commit {steps['commit']:.1f})"
        )
    print_gate_rows(gate)
    print_reading_rows(reading)
    print_phase_rows(phases)
    if memory is not None:
        print(
            f"memory: registering a {memory[0]:.0f} MB .pt2 peaked {memory[1]:.0f} MB above the baseline after imports (target <= 300 MB); "
            f"the 1-BatchNorm .pt2 {memory[2]:.0f} MB"
        )
    print(
        f"stats-only fine-tune stored {stored:,} bytes = {100 * stored / size:.3f}% of the {size:,}-byte checkpoint (target < 1%)"
    )
    print(
        f"lineage of a {args.chain}-version chain (middle version): median {lineage[0] * 1000:.1f} ms of {LINEAGE_CALLS} calls (target < 50 ms), "
        f"max {lineage[1] * 1000:.1f} ms (a full garbage collection of this process)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
