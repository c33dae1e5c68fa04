"""Benchmark: the serving collector's cost on a ResNet-50-sized PyTorch model at batch 1 (issue 17: at most 5% added latency).

Requests are timed with and without `converters.monitor(model, sample_rate=0.1)`, in alternating rounds (hooks on,
hooks off) so that load from anything else on the machine falls on both sides alike. The windows stay in the process
(no server) unless --server/--token/--ref are given: the sender works on its own thread, off the request path.
Wall-clock percentiles are only meaningful on an otherwise idle machine; the CPU time per request (all threads of
this process) is printed beside them as the figure that other load disturbs least.

The load average is printed at the start and the end: on a shared machine, read the figures beside it (and try
--threads 1: with two intra-op threads, every parallel region waits for a thread another process has preempted).

    python bench/monitor.py [--rounds 10] [--per-round 20] [--size 224] [--sample-rate 0.1] [--threads N] [--keep-sample N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import converters  # noqa: E402


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1):
        super().__init__()
        out = width * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(in_channels, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
        self.down = (
            nn.Sequential(nn.Conv2d(in_channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            if stride != 1 or in_channels != out
            else nn.Identity()
        )

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.down(x))


def resnet50(num_classes: int = 1000) -> nn.Module:
    """The ResNet-50 layout (bottlenecks 3-4-6-3, 53 BatchNorms, 25.6M parameters), untrained."""
    layers, channels = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for index in range(blocks):
            layers.append(Bottleneck(channels, width, stride if index == 0 else 1))
            channels = width * Bottleneck.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)]
    return nn.Sequential(*layers).eval()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--sample-rate", type=float, default=0.1)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument(
        "--keep-sample", type=int, default=0, help="monitor(..., keep_sample=N): also copy sampled inputs into the ring"
    )
    parser.add_argument("--server")
    parser.add_argument("--token", default=os.environ.get("NORMBRIDGE_TOKEN"))
    parser.add_argument("--ref")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    torch.manual_seed(0)
    model = resnet50()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, args.size, args.size)).astype(np.float32))
    with torch.no_grad():
        for _ in range(3):  # warm-up
            model(x)
    plain, watched = [], []
    cpu = {"plain": [], "watched": []}  # process CPU time per request: less sensitive than wall time to other load
    sampled = sent = dropped = 0
    for _ in range(args.rounds):
        for side in ("plain", "watched"):
            watch = (
                converters.monitor(
                    model,
                    server=args.server,
                    token=args.token,
                    ref=args.ref,
                    sample_rate=args.sample_rate,
                    window_requests=50,
                    window_seconds=60,
                    keep_sample=args.keep_sample,
                )
                if side == "watched"
                else None
            )
            times = watched if watch else plain
            with torch.no_grad():
                for _ in range(args.per_round):
                    start, start_cpu = time.perf_counter(), time.process_time()
                    model(x)
                    times.append((time.perf_counter() - start) * 1000)
                    cpu[side].append((time.process_time() - start_cpu) * 1000)
            if watch is not None:
                watch.close()
                stats = watch.stats()
                sampled, sent, dropped = sampled + stats.sampled, sent + stats.windows_sent, dropped + stats.dropped
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"collector overhead, ResNet-50 layout ({n_bn} BatchNorms, {params:.1f}M parameters), batch 1, {args.size}x{args.size}, "
        f"sample_rate={args.sample_rate}, keep_sample={args.keep_sample}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        "load average (1, 5, 15 min): at the start "
        + " ".join(f"{v:.2f}" for v in load_before)
        + ", at the end "
        + " ".join(f"{v:.2f}" for v in os.getloadavg())
        + f", on {os.cpu_count()} CPUs"
    )
    print(
        f"requests per side: {len(plain)} in {args.rounds} alternating rounds; sampled {sampled}; windows sent {sent}, dropped {dropped}"
    )
    print(f"{'':<18}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for name, times in (("without monitor", plain), ("with monitor", watched)):
        print(f"{name:<18}{percentile(times, 50):>10.2f}{percentile(times, 99):>10.2f}{statistics.fmean(times):>10.2f}")
    for label, q in (("p50", 50), ("p99", 99)):
        added = percentile(watched, q) / percentile(plain, q) - 1
        print(f"added latency {label}: {added * 100:+.1f}% (target at most +5%)")
    added_mean = statistics.fmean(watched) / statistics.fmean(plain) - 1
    print(f"added latency mean: {added_mean * 100:+.1f}%")
    added_cpu = statistics.fmean(cpu["watched"]) / statistics.fmean(cpu["plain"]) - 1
    print(
        f"CPU time per request: {statistics.fmean(cpu['plain']):.2f} ms without, {statistics.fmean(cpu['watched']):.2f} ms with ({added_cpu * 100:+.1f}%)"
    )


if __name__ == "__main__":
    main()
