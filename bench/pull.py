"""Benchmark: `normbridge pull` of a ~100 MB model against fetching the same bytes another way, in one run.

- `Registry.pull` of a `.pt2` registered in a registry whose blobs live in S3 (a local moto server): every blob
  read (several at once, ahead of the writer) and re-hashed as it streams in, the archive written straight into the
  temporary file of the atomic write and hashed as it is written (its structure was accepted by the safe `.pt2`
  reader at registration, so it is not read back); versus a plain boto3 `get_object` of the registered `.pt2`
  file's bytes from the same moto server.
  Target (issue 14): at least 0.8x boto3's throughput. Beside it, boto3's `download_file` of the same object followed by
  a sha256 of the file: the bytes on disk and checked once, as a careful user gets a file without normbridge.
- versus MLflow's download of the same model logged with mlflow.pytorch (serialization_format pt2) into a local
  MLflow store (sqlite + file artifacts): `mlflow artifacts download -u models:/NAME/1` as a user runs it (MLflow
  3.17 has no `mlflow models download`; this is its CLI for it), and MLflow's Python `download_artifacts` alone.

Beside each rate it prints the CPU seconds (user + sys) the step cost this process (the mlflow CLI: its child
process) and, for the S3 steps, the moto server's; and the load average, since the machine may be shared.

    python bench/pull.py [--megabytes 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import resource
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
BIN = Path(sys.executable).parent

import torch  # noqa: E402

from testkit.http_load import started  # noqa: E402
from testkit.processes import free_port  # noqa: E402

PULL_TARGET = 0.8  # normbridge pull MB/s over plain boto3 get_object's


def checkpoint(megabytes: int) -> torch.nn.Module:
    """Linear + BatchNorm1d blocks whose float32 parameters take about `megabytes` MB, statistics moved once."""
    width = 2048
    blocks = max(1, round(megabytes * 1e6 / (4 * width * width)))
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU()]
    torch.manual_seed(0)
    model = torch.nn.Sequential(*layers).train()
    with torch.no_grad():
        model(torch.randn(64, width))
    return model.eval()


#: name -> one (MB/s, CPU seconds of this process or its child, CPU seconds of the moto server or None) per round.
Rates = dict[str, list[tuple[float, float, float | None]]]


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def server_cpu(pid: int | None) -> float | None:
    """user + sys seconds of process `pid` so far (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, TypeError):
        return None


def rate(megabytes: float, fn, server: int | None = None, child: bool = False) -> tuple[float, float, float | None]:
    """(MB/s, CPU seconds it cost this process (`child`: its child processes), CPU seconds it cost process `server`)."""
    who = resource.RUSAGE_CHILDREN if child else resource.RUSAGE_SELF
    began, cpu, served = time.perf_counter(), cpu_seconds(who), server_cpu(server)
    fn()
    seconds = time.perf_counter() - began
    after = server_cpu(server)
    return megabytes / seconds, cpu_seconds(who) - cpu, None if served is None or after is None else after - served


def s3_rates(folder: Path, source: Path, rounds: int) -> Rates:
    import boto3

    from registry.service import Registry

    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(env)
    data = source.read_bytes()
    megabytes = len(data) / 1e6
    rates: Rates = {"boto3 get_object": [], "boto3 download_file + sha256": [], "normbridge pull (S3 blobs)": []}
    port = free_port()
    with started(
        "moto", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port, "/moto-api/", folder
    ) as moto:
        url = f"http://127.0.0.1:{port}"
        os.environ["NORMBRIDGE_S3_ENDPOINT"] = url
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        client.put_object(Bucket="bench", Key="plain/model.pt2", Body=data)
        registry = Registry(db=f"sqlite:///{folder / 'pull.db'}", blobs="s3://bench/normbridge", user="bench")
        registry.register("big", source)
        client.get_object(Bucket="bench", Key="plain/model.pt2")["Body"].read()  # warm both once
        registry.pull("big@1", folder / "warm.pt2")
        for round_ in range(rounds):

            def plain() -> None:
                assert len(client.get_object(Bucket="bench", Key="plain/model.pt2")["Body"].read()) == len(data)

            def to_file() -> None:  # what a careful user does to get a file they can trust: download it, then hash it
                client.download_file("bench", "plain/model.pt2", str(folder / f"plain-{round_}.pt2"))
                with open(folder / f"plain-{round_}.pt2", "rb") as stream:
                    hashlib.file_digest(stream, "sha256")

            def pull() -> None:
                registry.pull("big@1", folder / f"pulled-{round_}.pt2")

            steps = (
                ("boto3 get_object", plain),
                ("boto3 download_file + sha256", to_file),
                ("normbridge pull (S3 blobs)", pull),
            )
            for name, step in steps[:: 1 if round_ % 2 == 0 else -1]:
                os.sync()  # untimed: no step pays for writing back the file a previous one left in the page cache
                time.sleep(0.5)
                rates[name].append(rate(megabytes, step, server=moto.process.pid))
            (folder / f"pulled-{round_}.pt2").unlink()
            (folder / f"plain-{round_}.pt2").unlink()
    return rates


def mlflow_rates(folder: Path, model: torch.nn.Module, megabytes: float, rounds: int) -> Rates:
    import mlflow

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    experiment = mlflow.create_experiment("pull-bench", artifact_location=(folder / "mlartifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        mlflow.pytorch.log_model(
            model,
            name="model",
            input_example=torch.randn(2, 2048).numpy(),
            serialization_format="pt2",
            registered_model_name="big",
            pip_requirements=["torch"],
        )
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_REGISTRY_URI": uri}
    rates: Rates = {"mlflow artifacts download (CLI)": [], "mlflow download_artifacts (Python)": []}
    for round_ in range(rounds):
        target = folder / f"mlflow-cli-{round_}"
        rates["mlflow artifacts download (CLI)"].append(
            rate(
                megabytes,
                lambda: subprocess.run(
                    [str(BIN / "mlflow"), "artifacts", "download", "-u", "models:/big/1", "-d", str(target)],
                    env=env,
                    check=True,
                    capture_output=True,
                ),
                child=True,
            )
        )
        rates["mlflow download_artifacts (Python)"].append(
            rate(
                megabytes,
                lambda: mlflow.artifacts.download_artifacts(
                    "models:/big/1", dst_path=str(folder / f"mlflow-py-{round_}")
                ),
            )
        )
    return rates


def show(rates: Rates) -> None:
    for name, rounds in rates.items():
        speeds = [r[0] for r in rounds]
        servers = [r[2] for r in rounds if r[2] is not None]
        server = f"  server CPU {statistics.median(servers):.2f} s" if servers else ""
        print(
            f"  {name:<38} {statistics.median(speeds):8.1f}  ({' '.join(f'{v:.1f}' for v in speeds)})  "
            f"CPU {statistics.median(r[1] for r in rounds):.2f} s{server}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="normbridge-bench-pull-") as tmp:
        folder = Path(tmp)
        model = checkpoint(args.megabytes)
        source = folder / "model.pt2"
        torch.export.save(torch.export.export(model, (torch.randn(2, 2048),)), str(source))
        megabytes = source.stat().st_size / 1e6
        print(
            f"pull of a {megabytes:.1f} MB .pt2, {args.rounds} rounds (S3 = local moto server); MB/s median (per round), "
            f"median CPU seconds per step; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
        )
        rates = s3_rates(folder, source, args.rounds)
        show(rates)
        mlflow = mlflow_rates(folder, model, megabytes, args.rounds)
        show(mlflow)
        rates.update(mlflow)
    pulls, gets = rates["normbridge pull (S3 blobs)"], rates["boto3 get_object"]
    ratio = statistics.median(p[0] / b[0] for p, b in zip(pulls, gets))
    versus_mlflow = statistics.median(p[0] for p in pulls) / statistics.median(
        r[0] for r in rates["mlflow artifacts download (CLI)"]
    )
    print(
        f"normbridge pull / boto3 get_object: median {ratio:.2f} (target >= {PULL_TARGET}): {'met' if ratio >= PULL_TARGET else 'NOT met'}"
    )
    to_file = statistics.median(p[0] / b[0] for p, b in zip(pulls, rates["boto3 download_file + sha256"]))
    print(
        f"normbridge pull / boto3 download_file + sha256 (a file on disk, hashed once, no fsync): median {to_file:.2f}"
    )
    print(
        f"CPU of this process per pull / per get_object: {statistics.median(p[1] for p in pulls) / statistics.median(b[1] for b in gets):.1f}x; "
        f"load average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
    )
    print(f"normbridge pull / mlflow artifacts download (CLI): {versus_mlflow:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
