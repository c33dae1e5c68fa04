"""Benchmark: registering and pulling a 1 GB Hugging Face checkpoint folder, cold, beside the physical limit (issue 33).

In one run, every step a fresh process as a user runs it (`.venv/bin/normbridge ...`), timed by wall clock, with the
peak resident memory of all its processes together (bench/process_tree.py: its children and the shared gate worker
it starts, which outlives it):

- the folder (untimed, bench/checkpoint_folder_build.py): a Llama-shaped random bfloat16 checkpoint of about 1 GB in
  about 300 MB shards with its index, config, generation config and a 2.5 MB tokenizer; `normbridge inspect` must
  list its RMSNorms;
- the anchor: `sha256sum` of the folder's files, `cp -r` of the folder and a `sync`, as one shell command (reading
  the bytes once, hashing them and writing them once durably), run right before and right after each timed
  normbridge command; each ratio is against the mean of the two;
- `normbridge register` of a 0.2 MB Llama folder: what a cold registration costs whatever the checkpoint's size;
- `normbridge register ck DIR` (target <= 1.5x the anchor; peak RSS of every normbridge process together <= 1.5 GiB),
  cold (no shared gate worker running: the first registration on a machine), then the same folder into another
  registry with the worker the first one left (the CLI's default: later registrations run whole in that worker);
  `register --json` gives each step's seconds;
- `normbridge pull ck@1 -o OUT` (target <= 1.5x; the same memory target), OUT compared byte for byte with DIR;
- a recalibrated second version (only the RMSNorm weights' bytes rewritten) registered with `--parent ck@1`: the
  bytes the blob store grew by over the checkpoint's size (target < 1%);
- MLflow's `mlflow.transformers.log_model` of the same folder into a local sqlite + file store, offline: first its
  local-checkpoint path (copies the folder without loading the model), and when that fails (it does with MLflow 3.18
  and transformers 5: the reason is printed) a pipeline loaded from the folder, then logged.

Stores exist before the clock starts (a user registers into a registry that exists); the page cache is synced
(untimed) before every timed step, so no step pays for a previous one's writeback; nothing is dropped from the cache,
so every step reads the folder from memory. HF_HUB_OFFLINE=1 throughout.

    python bench/checkpoints.py [--layers 8] [--shard-mb 300] [--tmp DIR] [--keep]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.checkpoint_folder_build import build_folder, recalibrate  # noqa: E402
from bench.cold import SharedWorkers  # noqa: E402
from bench.process_tree import Run, run_cold  # noqa: E402

NORMBRIDGE = (
    str(ROOT / ".venv" / "bin" / "normbridge")
    if (ROOT / ".venv" / "bin" / "normbridge").exists()
    else str(Path(sys.executable).parent / "normbridge")
)
TIME_TARGET = 1.5  # register and pull, each over the anchor
RSS_TARGET = 1.5 * 2**30  # every normbridge process of one command together
STORED_TARGET = 0.01  # a recalibrated version's new blob bytes over the checkpoint's size

MLFLOW_SETUP = """
import sys, mlflow
mlflow.set_tracking_uri(f"sqlite:///{sys.argv[1]}/mlflow.db")
artifacts = (__import__("pathlib").Path(sys.argv[1]) / "artifacts").as_uri()
mlflow.MlflowClient().create_experiment("bench", artifact_location=artifacts)
"""

#: MLflow's own way for a folder on disk: the path, copied without loading the model.
MLFLOW_LOG_PATH = """
import sys, mlflow, mlflow.transformers
mlflow.set_tracking_uri(f"sqlite:///{sys.argv[1]}/mlflow.db")
mlflow.set_experiment("bench")
with mlflow.start_run():
    mlflow.transformers.log_model(transformers_model=sys.argv[2], name="model", task="text-generation",
                                  save_pretrained=True, pip_requirements=["transformers", "torch"])
"""

#: The way that works when the path does not: the folder loaded as a pipeline (the model in memory), then logged.
MLFLOW_LOG_PIPELINE = """
import sys, mlflow, mlflow.transformers, torch, transformers
mlflow.set_tracking_uri(f"sqlite:///{sys.argv[1]}/mlflow.db")
mlflow.set_experiment("bench")
pipeline = transformers.pipeline("text-generation", model=sys.argv[2], dtype=torch.bfloat16)
with mlflow.start_run():
    mlflow.transformers.log_model(transformers_model=pipeline, name="model", pip_requirements=["transformers", "torch"])
"""


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


class Bench:
    def __init__(self, work: Path):
        self.work = work
        self.workers = SharedWorkers(work / "workers")
        (work / "workers").mkdir(mode=0o700)  # a worker folder others can write to is refused: a private worker instead
        home = work / "home"
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "NORMBRIDGE_HOME": str(home),
            "NORMBRIDGE_WORKER_DIR": str(work / "workers"),
            "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow'}/mlflow.db",
        }
        for key in ("NORMBRIDGE_SERVER", "NORMBRIDGE_DB", "NORMBRIDGE_BLOBS", "NORMBRIDGE_TOKEN"):
            self.env.pop(key, None)
        self.store = ["--db", f"sqlite:///{work / 'registry.db'}", "--blobs", str(work / "blobs")]
        self.warm_store = ["--db", f"sqlite:///{work / 'registry-warm.db'}", "--blobs", str(work / "blobs-warm")]
        self.anchors: list[float] = []

    def normbridge(self, *args: str, label: str, cold: bool = True) -> Run:
        """One normbridge command: `cold`, with no shared gate worker alive before it (the one it starts stays up
        until the next cold command or the end); else with the worker the previous command left, settled."""
        if cold:
            self.workers.stop()
        else:
            self.workers.settle()
        os.sync()
        time.sleep(0.5)
        run = run_cold([NORMBRIDGE, *args], self.env, marker=str(self.work / "workers"), cwd=self.work)
        if run.returncode != 0:
            tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
            raise SystemExit(
                f"{label}: `normbridge {' '.join(args[:3])} ...` exited {run.returncode}: {' | '.join(tail)}"
            )
        for line in run.stderr.splitlines():
            if "warning" in line.lower():
                print(f"  {label}: {line.strip()[:200]}", flush=True)
        steps = ""
        if "--json" in args and args[0] == "register":
            seconds = json.loads(run.stdout).get("seconds", {})
            steps = (
                "; steps "
                + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items())
                + f", outside them {run.seconds - sum(seconds.values()):.2f} s"
            )
        print(
            f"  {label:<34} {run.seconds:7.2f} s{steps}\n  {'':<34} peak RSS together {gib(run.peak)} "
            f"(anonymous {gib(run.peak_anon)}), sum of each process's peak {gib(sum(run.peaks.values()))}, largest "
            f"process {gib(run.cli_maxrss)} (/usr/bin/time): "
            f"{run.processes()}",
            flush=True,
        )
        return run

    def anchor(self, source: Path) -> float:
        """sha256sum of the folder's files + cp -r + sync, as one shell command; its copy removed after (untimed)."""
        copy = self.work / "anchor-copy"
        os.sync()
        time.sleep(0.5)
        command = f"sha256sum {source}/* > /dev/null && cp -r {source} {copy} && sync"
        run = run_cold(["bash", "-c", command], self.env)
        if run.returncode != 0:
            raise SystemExit(f"anchor failed: {run.stderr.strip()}")
        shutil.rmtree(copy)
        os.sync()
        self.anchors.append(run.seconds)
        print(f"  {'anchor sha256sum + cp -r + sync':<34} {run.seconds:7.2f} s", flush=True)
        return run.seconds

    def mlflow(self, source: Path) -> tuple[Run | None, str, list[str]]:
        """MLflow's log_model of the folder in a cold process: (the run or None, how it was logged, why the ways
        tried first did not run)."""
        store = self.work / "mlflow"
        store.mkdir()
        setup = subprocess.run(
            [sys.executable, "-c", MLFLOW_SETUP, str(store)], env=self.env, capture_output=True, text=True
        )
        if setup.returncode != 0:
            return None, "", [f"creating the MLflow store failed: {setup.stderr.strip().splitlines()[-1]}"]
        failures = []
        for how, script in (
            ("the folder's path (no model load)", MLFLOW_LOG_PATH),
            ("a pipeline loaded from the folder", MLFLOW_LOG_PIPELINE),
        ):
            os.sync()
            time.sleep(0.5)
            run = run_cold([sys.executable, "-c", script, str(store), str(source)], self.env, cwd=self.work)
            label = f"mlflow log_model of {how}"
            if run.returncode != 0:
                lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
                failures.append(
                    f"{label} exited {run.returncode} after {run.seconds:.1f} s: "
                    f"{lines[-1] if lines else '(no output)'}"
                )
                print(f"  {label}: FAILED: {failures[-1]}", flush=True)
                continue
            stored = folder_bytes(store / "artifacts")
            print(
                f"  {label:<34} {run.seconds:7.2f} s  peak RSS together {gib(run.peak)} "
                f"({run.processes()}); artifacts {stored / 1e9:.2f} GB",
                flush=True,
            )
            return run, how, failures
        return None, "", failures


def identical(a: Path, b: Path) -> tuple[bool, str]:
    names_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    names_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    if names_a != names_b:
        return False, f"files differ: {sorted(set(map(str, names_a)) ^ set(map(str, names_b)))}"
    different = [str(n) for n in names_a if not filecmp.cmp(a / n, b / n, shallow=False)]
    return not different, (f"{len(names_a)} files byte-identical" if not different else f"differ: {different}")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="decoder layers (8: about 1 GB)")
    parser.add_argument("--shard-mb", type=int, default=300)
    parser.add_argument("--tmp", default=None, help="where the data goes (default: the system's temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the data folder")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    work = Path(tempfile.mkdtemp(prefix="normbridge-bench-checkpoints-", dir=args.tmp))
    free = shutil.disk_usage(work).free
    print(
        f"checkpoint folders, cold processes; data in {work} ({free / 1e9:.0f} GB free); "
        f"{os.cpu_count()} cores; load average {load()}",
        flush=True,
    )
    if free < 6e9:
        raise SystemExit(f"'{work}' has {free / 1e9:.1f} GB free; the run needs about 6 GB: pass --tmp DIR.")
    bench = Bench(work)
    try:
        return run(bench, work, args)
    finally:
        bench.workers.stop()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(bench: Bench, work: Path, args) -> int:
    source = work / "llama"
    began = time.perf_counter()
    tensors = build_folder(source, args.layers, args.shard_mb)
    size = folder_bytes(source)
    shards = sorted(source.glob("*.safetensors"))
    print(
        f"folder: {len(shards)} shards of {', '.join(f'{s.stat().st_size / 1e6:.0f}' for s in shards)} MB, "
        f"tensors {tensors / 1e9:.3f} GB, folder {size / 1e9:.3f} GB, built in {time.perf_counter() - began:.0f} s "
        "(untimed)",
        flush=True,
    )

    inspect = bench.normbridge("inspect", str(source), "--json", label="inspect (check)")
    kinds = [layer["kind"] for layer in json.loads(inspect.stdout)["layers"]]
    expected = 2 * args.layers + 1
    if kinds.count("rms") != expected:
        raise SystemExit(f"inspect listed {kinds.count('rms')} RMSNorms of {expected}: {kinds}")
    print(f"  inspect lists the {expected} RMSNorms", flush=True)
    bench.normbridge("models", *bench.store, label="empty registry (untimed setup)")
    bench.normbridge("models", *bench.warm_store, label="another one (untimed setup)")

    tiny = work / "tiny"
    build_folder(tiny, 1, args.shard_mb, tiny=True)
    fixed = bench.normbridge(
        "register",
        "tiny",
        str(tiny),
        "--json",
        *bench.store,
        label=f"register a {folder_bytes(tiny) / 1e6:.1f} MB folder",
    )
    a1 = bench.anchor(source)
    register = bench.normbridge(
        "register", "ck", str(source), "--json", *bench.store, label="normbridge register ck DIR"
    )
    a2 = bench.anchor(source)
    warm = bench.normbridge(
        "register",
        "ck",
        str(source),
        "--json",
        *bench.warm_store,
        cold=False,
        label="the same, warm worker, other registry",
    )
    a2b = bench.anchor(source)
    out = work / "pulled"
    pull = bench.normbridge("pull", "ck@1", "-o", str(out), *bench.store, label="normbridge pull ck@1 -o OUT")
    a3 = bench.anchor(source)
    same, detail = identical(source, out)
    print(f"  pulled folder: {detail}", flush=True)
    shutil.rmtree(out)

    second = work / "llama-recalibrated"
    subprocess.run(["cp", "-r", str(source), str(second)], check=True)
    changed, changed_bytes = recalibrate(second)
    blobs_before = folder_bytes(work / "blobs")
    db_before = (work / "registry.db").stat().st_size
    register2 = bench.normbridge(
        "register",
        "ck",
        str(second),
        "--parent",
        "ck@1",
        "--operation",
        "recalibrated",
        "--json",
        *bench.store,
        label="register ck (recalibrated)",
    )
    grew = folder_bytes(work / "blobs") - blobs_before
    db_grew = (work / "registry.db").stat().st_size - db_before
    diff = subprocess.run(
        [NORMBRIDGE, "diff", "ck@1", "ck@2", *bench.store], env=bench.env, capture_output=True, text=True
    )
    headline = (diff.stdout.strip().splitlines() or [diff.stderr.strip()])[0]
    print(
        f"  recalibrated: {changed} norm tensors ({changed_bytes} bytes) rewritten; blob store grew {grew} bytes "
        f"({grew / size:.4%} of {size / 1e9:.2f} GB), database {db_grew} bytes; diff: {headline}",
        flush=True,
    )
    shutil.rmtree(second)

    mlflow, how, failures = bench.mlflow(source)
    a4 = bench.anchor(source)

    mean = statistics.mean
    reg_anchor, warm_anchor, pull_anchor, late_anchor = mean((a1, a2)), mean((a2, a2b)), mean((a2b, a3)), mean((a3, a4))

    def timed(name: str, run: Run, anchor: float, target: float | None = TIME_TARGET):
        ratio = run.seconds / anchor
        return (
            name,
            f"{run.seconds:.2f} s / {anchor:.2f} s",
            ratio,
            f"<= {target}x" if target else "-",
            ratio <= target if target else None,
        )

    def memory(name: str, run: Run, target: float | None = RSS_TARGET):
        return (
            name,
            f"{gib(run.peak)} (anonymous {gib(run.peak_anon)})",
            None,
            f"<= {gib(target)}" if target else "-",
            run.peak <= target if target else None,
        )

    rows = [
        ("register a tiny folder (fixed cost)", f"{fixed.seconds:.2f} s", None, "-", None),
        timed("register time / anchor", register, reg_anchor),
        memory("register peak RSS, all processes", register),
        timed("register, warm worker / anchor", warm, warm_anchor),
        memory("register, warm worker, peak RSS", warm),
        timed("pull time / anchor", pull, pull_anchor),
        memory("pull peak RSS, all processes", pull),
        ("pull byte-identical", detail, None, "identical", same),
        (
            "recalibrated version stores",
            f"{grew} B of {size} B",
            grew / size,
            f"< {STORED_TARGET:.0%}",
            grew / size < STORED_TARGET,
        ),
        timed("register recalibrated / anchor", register2, late_anchor, None),
        memory("register recalibrated peak RSS", register2),
    ]
    if mlflow is not None:
        rows += [
            timed("mlflow log_model / anchor", mlflow, late_anchor, None),
            memory("mlflow log_model peak RSS", mlflow, None),
            (
                "register / mlflow log_model",
                f"{register.seconds:.2f} s / {mlflow.seconds:.2f} s",
                register.seconds / mlflow.seconds,
                "-",
                None,
            ),
        ]
    else:
        rows.append(("mlflow log_model", "did not run (see above)", None, "-", None))
    anchors = (a1, a2, a2b, a3, a4)
    print(
        f"\nanchors: {', '.join(f'{a:.2f} s' for a in anchors)} ({size / 1e6 / statistics.mean(anchors):.0f} MB/s); "
        f"load average at the end {load()}"
    )
    for failure in failures:
        print(f"MLflow: {failure}")
    if mlflow is not None:
        print(f"MLflow logged {how}")
    print(f"{'measure':<34} {'value':<34} {'ratio':>8}  {'target':<12} result")
    for name, value, ratio, target, ok in rows:
        shown = f"{ratio:.4%}" if ratio is not None and ratio < 0.1 else (f"{ratio:.2f}" if ratio is not None else "")
        print(f"{name:<34} {value:<34} {shown:>8}  {target:<12} {'' if ok is None else verdict(ok)}")
    return 0  # targets are printed, never asserted (as the other benchmarks)


if __name__ == "__main__":
    sys.exit(main())
