"""Benchmark: the registry against what a user would do instead, in one run.

- register a ~100 MB PyTorch checkpoint (equivalence gate included) versus `sha256sum` + `cp`
  of the same bytes, and versus MLflow's `log_model` + `register_model` into a local MLflow store;
- bytes stored by a statistics-only fine-tune versus a full copy;
- a lineage query over a 1,000-version chain.

Targets (issue 4): at least half the throughput of sha256sum+cp; at least 3x faster than MLflow;
a stats-only version stores under 1% of the full checkpoint; lineage under 50 ms.

    python bench/registry.py [--megabytes 100]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
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


def checkpoint(megabytes: int) -> torch.nn.Module:
    """An MLP with BatchNorm whose float32 parameters take about `megabytes` MB."""
    width = 2048
    blocks = max(1, round(megabytes * 1e6 / (4 * width * width)))
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU()]
    torch.manual_seed(0)
    model = torch.nn.Sequential(*layers)
    model.train()
    with torch.no_grad():
        model(torch.randn(64, width))
    return model.eval()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def sha256sum_cp(model: torch.nn.Module, folder: Path) -> tuple[float, int]:
    from safetensors.torch import save_file

    source = folder / "checkpoint.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(source))
    size = source.stat().st_size

    def run():
        subprocess.run(["sha256sum", str(source)], check=True, capture_output=True)
        shutil.copyfile(source, folder / "copy.safetensors")
        os.sync()

    seconds, _ = timed(run)
    return seconds, size


def mlflow_log_register(model: torch.nn.Module, folder: Path) -> float:
    import mlflow
    import mlflow.pytorch

    mlflow.set_tracking_uri(f"sqlite:///{folder}/mlflow.db")
    # An explicit artifact location: MLflow's default is ./mlruns in the working directory.
    client = mlflow.MlflowClient()
    if client.get_experiment_by_name("bench") is None:
        client.create_experiment("bench", artifact_location=(folder / "mlflow-artifacts").as_uri())
    mlflow.set_experiment("bench")  # creates the store outside the timing
    with mlflow.start_run():
        mlflow.log_param("warm", 1)

    def run():
        with mlflow.start_run():
            info = mlflow.pytorch.log_model(model, name="model", serialization_format="pickle")
            mlflow.register_model(info.model_uri, "bench")

    seconds, _ = timed(run)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--chain", type=int, default=1000)
    args = parser.parse_args()
    from registry.service import Registry

    model = checkpoint(args.megabytes)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        registry = Registry(db=f"sqlite:///{folder}/registry.db", blobs=str(folder / "blobs"))
        warm = checkpoint(1)
        registry.register("warmup", warm)  # imports the frameworks the gate uses, outside the timing
        nb_seconds, first = timed(lambda: registry.register("ckpt", model))
        size = sum(int(t.nbytes) for t in model.state_dict().values())
        copy_seconds, file_size = sha256sum_cp(model, folder)
        mlflow_seconds = mlflow_log_register(model, folder)
        rows.append(("register ~%d MB" % (size // 1_000_000), "normbridge register (gate included)", nb_seconds, size / nb_seconds / 1e6))
        rows.append(("", "sha256sum + cp", copy_seconds, file_size / copy_seconds / 1e6))
        rows.append(("", "mlflow log_model + register_model", mlflow_seconds, size / mlflow_seconds / 1e6))

        before = folder_bytes(folder / "blobs")
        model.train()
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(64, model[0].in_features) * 2 + 1)
        model.eval()
        registry.register("ckpt", model, note="statistics-only fine-tune")
        stats_bytes = folder_bytes(folder / "blobs") - before

        chain = "chain"
        tiny = checkpoint(1)
        from registry.artifact import extract_artifact

        artifact = extract_artifact(tiny)
        store = registry.meta
        parent = None
        for number in range(1, args.chain + 1):
            manifest = artifact.manifest.model_dump(mode="json")
            manifest["note"] = f"v{number}"
            record, _ = store.add_version(chain, f"digest-{number}", f"content-{number}", manifest, [], parent, "fine-tuned", None, "bench")
            parent = (chain, record.number)
        lineage_seconds = min(timed(lambda: registry.lineage(f"{chain}@{args.chain // 2}"))[0] for _ in range(5))

    print(f"registry benchmark, checkpoint {size / 1e6:.0f} MB of float32 tensors")
    print(f"{'case':<22} {'tool':<38} {'seconds':>9} {'MB/s':>8}")
    for case, tool, seconds, rate in rows:
        print(f"{case:<22} {tool:<38} {seconds:>9.3f} {rate:>8.1f}")
    print()
    print(f"throughput vs sha256sum+cp: {rows[0][3] / rows[1][3]:.2f}x (target >= 0.5x); vs MLflow: {rows[2][2] / rows[0][2]:.1f}x faster (target >= 3x)")
    print(f"stats-only fine-tune stored {stats_bytes:,} bytes = {100 * stats_bytes / size:.3f}% of the {size:,}-byte checkpoint (target < 1%)")
    print(f"lineage of a {args.chain}-version chain (middle version): {lineage_seconds * 1000:.1f} ms (target < 50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
