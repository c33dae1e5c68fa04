"""Would a lighter Keras backend give the gate's Keras leg the same results? (issue 15: the cheapest faithful way).

A registration of a .pt2 has torch imported already, and Keras 3 can run on torch; this compares the
Keras leg of `converters.check` on the TensorFlow backend (what the gate runs) with the same leg on the
torch backend, field by field, over torch's stock normalization layers in four dtypes with trained-looking
state. Each backend runs in its own process (Keras fixes its backend at import). Prints how many checks
differ, which verdicts change, and each backend's import CPU time beside torch's.

    python bench/keras_leg_backends.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "float64", "float16", "bfloat16")
LEG = """
import json, resource, sys, torch
start = resource.getrusage(resource.RUSAGE_SELF)
import keras
end = resource.getrusage(resource.RUSAGE_SELF)
from bench.keras_leg_backends import layers
from converters.equivalence import check
import converters
results = {}
for name, layer in layers():
    spec = converters.to_spec(layer)
    try:
        results[name] = check(spec, frameworks=["keras"]).model_dump(mode="json")
    except Exception as error:
        results[name] = {"raised": f"{type(error).__name__}: {error}"}
import_cpu = (end.ru_utime + end.ru_stime) - (start.ru_utime + start.ru_stime)
json.dump({"backend": keras.backend.backend(), "import_cpu": import_cpu, "results": results}, open(sys.argv[1], "w"))
"""


def layers():
    """(name, torch layer) pairs: every stock normalization class, state moved away from its initial values,
    eval mode."""
    import torch

    torch.manual_seed(0)
    for dtype in DTYPES:
        built = {
            "batchnorm2d": torch.nn.BatchNorm2d(6, eps=1e-3, momentum=0.01),
            "batchnorm1d": torch.nn.BatchNorm1d(6, eps=2e-5),
            "layernorm": torch.nn.LayerNorm((4, 5), eps=1e-5),
            "groupnorm": torch.nn.GroupNorm(3, 6, eps=1e-5),
            "instancenorm2d": torch.nn.InstanceNorm2d(6, affine=True, track_running_stats=True),
            "rmsnorm": torch.nn.RMSNorm(8, eps=1e-6),
        }
        for name, layer in built.items():
            with torch.no_grad():
                for key, tensor in layer.state_dict().items():
                    if tensor.is_floating_point():
                        tensor.copy_(
                            torch.rand_like(tensor) + 0.5
                            if "var" in key or key == "weight"
                            else torch.randn_like(tensor) * 0.5
                        )
            yield f"{name}/{dtype}", layer.to(getattr(torch, dtype)).eval()


def _differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in sorted(set(a) | set(b)) for d in _differences(a.get(key), b.get(key), f"{path}.{key}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [(path, a, b)]


def main() -> int:
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("tensorflow", "torch"):
            out = Path(tmp) / f"{backend}.json"
            env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
            subprocess.run([sys.executable, "-c", LEG, str(out)], env=env, cwd=ROOT, check=True, capture_output=True)
            runs[backend] = json.loads(out.read_text())
    tf, other = runs["tensorflow"]["results"], runs["torch"]["results"]
    differing = {name: _differences(tf[name], other[name]) for name in tf}
    changed = [name for name in tf if tf[name].get("passed") != other[name].get("passed")]
    print(
        f"Keras leg of the gate, TensorFlow backend vs torch backend, {len(tf)} torch layers (kinds x {', '.join(DTYPES)}):"
    )
    print(
        f"  identical results: {sum(not d for d in differing.values())} of {len(tf)}; verdict changed: {len(changed)}"
    )
    for name in changed:
        print(f"    {name}: passed on TensorFlow {tf[name].get('passed')}, on torch {other[name].get('passed')}")
    for backend, run in runs.items():
        print(f"  import keras on the {backend} backend after torch: {run['import_cpu']:.2f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
