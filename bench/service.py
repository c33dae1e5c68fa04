"""Benchmark: `normbridge serve` against what a team would run instead, in one run on this machine.

- metadata reads: GET /api/v1/models/{name}/versions/{n} on a local `normbridge serve` (SQLite + a local
  blob folder) versus the same question to a local `mlflow server` (SQLite backend, in a temp dir):
  GET /api/2.0/mlflow/model-versions/get?name=&version=. Both servers get the same number of worker
  processes and the same closed-loop client (N threads, keep-alive connections, fixed duration);
- artifact upload/download: a ~100 MB model of float32 tensors sent as a bundle to `normbridge serve`
  with an S3 blob store on a local moto server (equivalence gate, hashing and S3 writes included),
  versus a plain boto3 put_object/get_object of the same bytes to the same moto server.

Targets: metadata reads >= 2x MLflow's throughput; upload >= 80% of plain boto3's throughput.
Every server runs in its own process on 127.0.0.1 and is stopped at the end; all state lives in a
temp dir (MLflow never creates ./mlruns here).

    python bench/service.py [--seconds 10] [--clients 8] [--workers 1,2] [--megabytes 100]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
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

from testkit.http_load import LoadResult, read_load, request_json, started, warm  # noqa: E402
from testkit.processes import free_port  # noqa: E402

READS_TARGET = 2.0  # normbridge reads/s over MLflow's
UPLOAD_TARGET = 0.8  # normbridge upload MB/s over plain boto3 put_object's


# ---------------------------------------------------------------------------- models


def bn_onnx_bytes(seed: int, channels: int = 8) -> bytes:
    """A one-node ONNX model (eval-mode BatchNormalization with random statistics): a small, valid upload."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    arrays = (
        (rng.uniform(0.5, 1.5, channels), "s"),
        (rng.normal(size=channels), "b"),
        (rng.normal(size=channels), "m"),
        (rng.uniform(0.5, 2.0, channels), "v"),
    )
    shape = ["N", channels, "H", "W"]
    graph = helper.make_graph(
        [helper.make_node("BatchNormalization", ["X", "s", "b", "m", "v"], ["Y"], epsilon=1e-5, name="bn")],
        "bn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape)],
        initializer=[numpy_helper.from_array(a.astype(np.float32), n) for a, n in arrays],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]).SerializeToString()


def checkpoint(megabytes: int, seed: int = 0):
    """An MLP with BatchNorm whose float32 parameters take about `megabytes` MB (as bench/registry.py)."""
    import torch

    width = 2048
    blocks = max(1, round(megabytes * 1e6 / (4 * width * width)))
    layers: list = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.ReLU()]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*layers)
    model.train()
    with torch.no_grad():
        model(torch.randn(64, width))
    return model.eval()


# ---------------------------------------------------------------------------- the two read servers


def normbridge_command(port: int, db: str, blobs: str, workers: int, extra: list[str] = ()) -> list[str]:
    command = [
        str(BIN / "normbridge"),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        db,
        "--blobs",
        blobs,
        *extra,
    ]
    if workers > 1:
        command += ["--workers", str(workers)]
    return command


def create_token(db: str, role: str = "admin") -> str:
    done = subprocess.run(
        [str(BIN / "normbridge"), "token", "create", "--db", db, "--owner", "bench", "--role", role, "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return json.loads(done.stdout)["token"]


def upload(url: str, name: str, data: bytes, fmt: str, headers: dict, timeout: float = 600.0) -> tuple[float, dict]:
    """POST a model file (streamed in 1 MiB chunks); seconds until the answer, and the answer."""
    import httpx

    def chunks():
        view = memoryview(data)
        for start in range(0, len(data), 1 << 20):
            yield bytes(view[start : start + (1 << 20)])

    began = time.perf_counter()
    response = httpx.post(
        f"{url}/api/v1/models/{name}/versions",
        params={"format": fmt},
        content=chunks(),
        headers={**headers, "Content-Type": "application/octet-stream"},
        timeout=timeout,
    )
    seconds = time.perf_counter() - began
    if response.status_code not in (200, 201):
        raise RuntimeError(f"upload of {name} answered {response.status_code}: {response.text[:2000]}")
    return seconds, response.json()


def download(url: str, path: str, headers: dict) -> tuple[float, int]:
    import httpx

    began = time.perf_counter()
    size = 0
    with httpx.stream("GET", url + path, headers=headers, timeout=600) as response:
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} answered {response.status_code}: {response.read()[:2000]!r}")
        for chunk in response.iter_raw(1 << 20):
            size += len(chunk)
    return time.perf_counter() - began, size


def prepared_normbridge(folder: Path) -> tuple[str, str, str]:
    """(db, blobs, read token) of a registry holding bench@1; registered once, over HTTP, on the first call."""
    db, blobs = f"sqlite:///{folder / 'normbridge.db'}", str(folder / "blobs")
    marker = folder / "normbridge.token"
    if not marker.exists():
        writer = create_token(db, "write")
        port = free_port()
        with started(
            "normbridge-setup", normbridge_command(port, db, blobs, 1), port, "/api/v1/health", folder
        ) as server:
            upload(server.url, "bench", bn_onnx_bytes(0), "onnx", {"Authorization": f"Bearer {writer}"})
        marker.write_text(create_token(db, "read"))
    return db, blobs, marker.read_text()


def normbridge_reads(folder: Path, args, workers: int) -> dict[str, LoadResult]:
    """Reads/s of GET versions/1 on normbridge serve (SQLite + local blobs), with a read token and without one."""
    db, blobs, token = prepared_normbridge(folder)
    port = free_port()
    results = {}
    with started(
        "normbridge", normbridge_command(port, db, blobs, workers, ["--insecure-local"]), port, "/api/v1/health", folder
    ) as server:
        path = "/api/v1/models/bench/versions/1"

        def check(body: bytes) -> bool:
            return b'"number":1' in body.replace(b" ", b"")

        for label, headers in (("token", {"Authorization": f"Bearer {token}"}), ("anonymous (--insecure-local)", {})):
            warm(server.url, path, headers)
            results[label] = read_load(server.url, path, headers, args.clients, args.seconds, check)
    return results


def mlflow_reads(folder: Path, args, workers: int) -> LoadResult:
    """Reads/s of model-versions/get on `mlflow server` (SQLite backend, artifacts in the temp dir)."""
    port = free_port()
    home = folder / "mlflow"
    home.mkdir(exist_ok=True)
    command = [
        str(BIN / "mlflow"),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--backend-store-uri",
        f"sqlite:///{home / 'mlflow.db'}",
        "--default-artifact-root",
        (home / "artifacts").as_uri(),
        "--artifacts-destination",
        (home / "mlartifacts").as_uri(),
    ]
    with started("mlflow", command, port, "/health", home) as server:
        api = server.url + "/api/2.0/mlflow"
        path = "/api/2.0/mlflow/model-versions/get?name=bench&version=1"
        if not (home / "created").exists():
            request_json("POST", f"{api}/registered-models/create", {"name": "bench"})
            request_json(
                "POST", f"{api}/model-versions/create", {"name": "bench", "source": "s3://bench-artifacts/model"}
            )
            (home / "created").touch()

        def check(body: bytes) -> bool:
            return b'"version":"1"' in body.replace(b" ", b"")

        warm(server.url, path, {})
        return read_load(server.url, path, {}, args.clients, args.seconds, check)


# ---------------------------------------------------------------------------- throughput against S3 (moto)


def artifact_folder(model, folder: Path) -> Path:
    """The model's artifact folder (manifest.json + blobs/), what `normbridge --server URL register` uploads."""
    from registry.artifact import extract_artifact
    from registry.manifest_io import save_artifact_folder

    return save_artifact_folder(extract_artifact(model), folder)


def s3_throughput(folder: Path, args) -> dict[str, list[float]]:
    """MB/s per round: normbridge upload/download of a bundle (S3 blob store) vs boto3 put/get of the same bytes,
    same moto server.

    Each round is a new model (new bytes, so nothing is deduplicated), after one untimed round of each. The normbridge
    upload is what a user runs:
    RemoteRegistry.register(artifact folder), the client behind `normbridge --server URL register`, timed until the
    server has gated, stored and committed the version. boto3 puts the very bytes the client sends (the same tar).
    """
    import boto3

    from registry.client import RemoteRegistry
    from registry.client_transfer import folder_tar_chunks

    port = free_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(env)
    rates: dict[str, list[float]] = {
        "boto3 put_object": [],
        "normbridge upload (bundle, gate, S3)": [],
        "boto3 get_object": [],
        "normbridge download (bundle)": [],
    }
    with started(
        "moto", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port, "/moto-api/", folder
    ) as moto:
        client = boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        client.put_object(Bucket="bench", Key="plain/warm", Body=b"x" * 1024)  # connection set up outside the timing
        db = f"sqlite:///{folder / 's3-normbridge.db'}"
        token = create_token(db, "write")
        headers = {"Authorization": f"Bearer {token}"}
        nb_port = free_port()
        s3_env = {**env, "NORMBRIDGE_S3_ENDPOINT": moto.url}
        command = normbridge_command(nb_port, db, "s3://bench/normbridge", 1)
        with (
            started("normbridge-s3", command, nb_port, "/api/v1/health", folder, env=s3_env) as server,
            RemoteRegistry(server.url, token) as remote,
        ):
            upload(
                server.url, "warmup", bn_onnx_bytes(1), "onnx", headers
            )  # the gate's frameworks imported outside the timing
            # one untimed round for both, so neither pays for first-touching its memory inside the timing
            artifact = artifact_folder(checkpoint(args.megabytes, seed=10_000), folder / "artifact-warmup")
            client.put_object(
                Bucket="bench", Key="plain/warmup.tar", Body=b"".join(folder_tar_chunks(artifact, lambda done: None))
            )
            remote.register("warmup-bundle", artifact)
            shutil.rmtree(artifact)
            for round_ in range(args.rounds):
                artifact = artifact_folder(checkpoint(args.megabytes, seed=round_), folder / f"artifact-{round_}")
                data = b"".join(folder_tar_chunks(artifact, lambda done: None))
                megabytes = len(data) / 1e6

                def plain_put() -> None:
                    began = time.perf_counter()
                    client.put_object(Bucket="bench", Key=f"plain/bundle-{round_}.tar", Body=data)
                    rates["boto3 put_object"].append(megabytes / (time.perf_counter() - began))

                def normbridge_upload() -> None:
                    began = time.perf_counter()
                    registration = remote.register(f"big-{round_}", artifact)
                    rates["normbridge upload (bundle, gate, S3)"].append(megabytes / (time.perf_counter() - began))
                    assert registration.created, registration

                for step in (
                    (plain_put, normbridge_upload) if round_ % 2 == 0 else (normbridge_upload, plain_put)
                ):  # alternate who goes first
                    step()
                began = time.perf_counter()
                fetched = client.get_object(Bucket="bench", Key=f"plain/bundle-{round_}.tar")["Body"].read()
                rates["boto3 get_object"].append(megabytes / (time.perf_counter() - began))
                assert fetched == data
                seconds, size = download(server.url, f"/api/v1/models/big-{round_}/versions/1/bundle", headers)
                rates["normbridge download (bundle)"].append(size / 1e6 / seconds)
                data = fetched = None  # free the round's bytes (not `del`: plain_put reads `data` from this scope)
                shutil.rmtree(artifact)
        rates["bytes"] = [megabytes * 1e6]
    return rates


# ---------------------------------------------------------------------------- report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each read run")
    parser.add_argument("--clients", type=int, default=8, help="concurrent client threads (keep-alive connections)")
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2],
        help="comma-separated worker process counts to compare at (the same for both servers each time)",
    )
    parser.add_argument("--megabytes", type=int, default=100, help="size of the uploaded model's float32 tensors")
    parser.add_argument("--rounds", type=int, default=5, help="upload/download rounds (the median is compared)")
    parser.add_argument("--skip-reads", action="store_true")
    parser.add_argument("--skip-s3", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="nb-bench-service-") as tmp:
        folder = Path(tmp)
        print(
            f"service benchmark on {os.cpu_count()} cores: {args.clients} client threads x {args.seconds:.0f} s per server and "
            f"worker count ({', '.join(map(str, args.workers))}); load average before: {os.getloadavg()[0]:.1f}"
        )
        ok = True
        if not args.skip_reads:
            print()
            print(f"{'metadata read (GET one version)':<62} {'reads/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
            verdicts = []
            for workers in args.workers:
                nb = normbridge_reads(folder, args, workers)
                ml = mlflow_reads(folder, args, workers)
                rows = [(f"normbridge serve, {label}", result) for label, result in nb.items()] + [
                    ("mlflow server", ml)
                ]
                for label, result in rows:
                    print(
                        f"{label + f' [{workers} worker(s)]':<62} {result.per_second:>9.0f} {1000 * result.percentile(50):>8.2f} "
                        f"{1000 * result.percentile(99):>8.2f} {result.errors:>7}"
                    )
                for label, result in nb.items():
                    ratio = result.per_second / ml.per_second
                    met = ratio >= READS_TARGET
                    ok &= met
                    verdicts.append(
                        f"reads, {workers} worker(s), normbridge ({label}) / mlflow: {ratio:.2f}x (target >= {READS_TARGET:.0f}x): "
                        f"{'MET' if met else 'MISSED'}"
                    )
            print("\n".join(verdicts))
        if not args.skip_s3:
            rates = s3_throughput(folder, args)
            print()
            print(
                f"artifact throughput, {rates.pop('bytes')[0] / 1e6:.1f} MB bundle, S3 = local moto server, {args.rounds} rounds "
                "(a new model each round)"
            )
            print(f"{'path':<44} {'median MB/s':>12}   per round")
            for label, values in rates.items():
                print(f"{label:<44} {statistics.median(values):>12.1f}   {' '.join(f'{v:.1f}' for v in values)}")
            ups = [
                nb / plain
                for nb, plain in zip(rates["normbridge upload (bundle, gate, S3)"], rates["boto3 put_object"])
            ]
            downs = [nb / plain for nb, plain in zip(rates["normbridge download (bundle)"], rates["boto3 get_object"])]
            ratio = statistics.median(ups)
            met = ratio >= UPLOAD_TARGET
            ok &= met
            print(
                f"upload, normbridge / boto3 put_object: median {ratio:.2f} (per round {' '.join(f'{r:.2f}' for r in ups)}; "
                f"target >= {UPLOAD_TARGET:.2f}): {'MET' if met else 'MISSED'}"
            )
            print(
                f"download, normbridge / boto3 get_object: median {statistics.median(downs):.2f} (per round {' '.join(f'{r:.2f}' for r in downs)})"
            )
        print()
        print(f"load average after: {os.getloadavg()[0]:.1f} (another process on these cores skews every number above)")
        print("all targets met" if ok else "some targets MISSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
