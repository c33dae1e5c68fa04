"""Benchmark: one layer of each kind to ONNX with normbridge versus torch.onnx.export(dynamo=True)
and Keras model.export(format="onnx") (tf2onnx), in one run.

Prints median times, the speed ratio, the ops each produced and whether eps/momentum survived.
Targets (issue 2): >= 100x faster than torch.onnx.export per layer; native ops only at opset >= 23;
zero eps/momentum mismatches where the anchors have some.

    python bench/convert.py [--repeat-normbridge 30] [--repeat-anchor 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import logging  # noqa: E402

logging.disable(logging.WARNING)  # torch.onnx logs a line per missing torchvision op
warnings.filterwarnings("ignore")

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import converters  # noqa: E402
from schemas.floats import shortest_float32_decimal  # noqa: E402

OPSET = 23
NORM_OPS = {
    "BatchNormalization",
    "LayerNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "RMSNormalization",
}


def layers() -> dict[str, tuple[torch.nn.Module, tuple[int, ...]]]:
    """One hand-built layer per kind, with non-default eps (and momentum) and moved statistics."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(16, eps=1e-3, momentum=0.01)
    bn.train()
    for _ in range(3):
        bn(torch.randn(8, 16, 8, 8) * 2 + 1)
    return {
        "batch": (bn.eval(), (2, 16, 8, 8)),
        "layer": (torch.nn.LayerNorm(64, eps=2e-5).eval(), (2, 10, 64)),
        "rms": (torch.nn.RMSNorm(64, eps=1e-6).eval(), (2, 10, 64)),
        "group": (torch.nn.GroupNorm(4, 16, eps=1e-4).eval(), (2, 16, 8, 8)),
        "instance": (torch.nn.InstanceNorm2d(16, eps=1e-3, affine=True).eval(), (2, 16, 8, 8)),
    }


def median_seconds(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def op_summary(model: onnx.ModelProto) -> str:
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ",".join(f"{op}x{n}" if n > 1 else op for op, n in ops.items())


def found_eps(model: onnx.ModelProto) -> float | None:
    """eps as the graph holds it: the native op's attribute, else the small scalar added before Sqrt."""
    for node in model.graph.node:
        if node.op_type in NORM_OPS:
            for attr in node.attribute:
                if attr.name == "epsilon":
                    return shortest_float32_decimal(attr.f)
            return 1e-5  # the ONNX op default
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    constants[node.output[0]] = onnx.numpy_helper.to_array(attr.t)
    for node in model.graph.node:
        if node.op_type == "Add":
            for name in node.input:
                value = constants.get(name)
                if value is not None and value.size == 1 and 0 < float(value.reshape(-1)[0]) < 0.05:
                    return shortest_float32_decimal(float(value.reshape(-1)[0]))
    return None


def found_momentum(model: onnx.ModelProto) -> float | None:
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            for attr in node.attribute:
                if attr.name == "momentum":
                    return shortest_float32_decimal(attr.f)
            return 0.9  # the ONNX op default
    return None


def torch_export(module: torch.nn.Module, shape: tuple[int, ...]) -> onnx.ModelProto:
    with (
        tempfile.TemporaryDirectory() as folder,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        path = Path(folder) / "m.onnx"
        torch.onnx.export(module, (torch.randn(*shape),), str(path), dynamo=True, opset_version=OPSET)
        return onnx.load(str(path))


def keras_model(layer, shape: tuple[int, ...]):
    """A one-layer Keras model that has been called once (export needs that); built outside the timing."""
    import keras

    model = keras.Sequential([keras.Input(shape=shape[1:]), layer])
    model(np.zeros(shape, np.float32))
    return model


def keras_export(model) -> onnx.ModelProto:
    with (
        tempfile.TemporaryDirectory() as folder,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        path = Path(folder) / "m.onnx"
        model.export(str(path), format="onnx", verbose=False)
        return onnx.load(str(path))


def keras_shape(spec, torch_shape: tuple[int, ...]) -> tuple[int, ...]:
    if spec.layout == "channels_first" and len(torch_shape) > 2:
        return (torch_shape[0],) + torch_shape[2:] + (torch_shape[1],)
    return torch_shape


def verdict(expected_eps, expected_momentum, model) -> str:
    eps, momentum = found_eps(model), found_momentum(model)
    problems = []
    if eps is None:
        problems.append("eps lost (folded into constants)")
    elif eps != expected_eps:
        problems.append(f"eps {eps:g}!={expected_eps:g}")
    if expected_momentum is not None and momentum is not None and momentum != expected_momentum:
        problems.append(f"momentum {momentum:g}!={expected_momentum:g}")
    return "ok" if not problems else "MISMATCH " + "; ".join(problems)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat-normbridge", type=int, default=30)
    parser.add_argument("--repeat-anchor", type=int, default=3)
    args = parser.parse_args()
    import keras  # noqa: F401 - imported once, outside the timings

    rows = []
    for kind, (module, shape) in layers().items():
        spec = converters.to_spec(module)
        expected_momentum = (
            spec.momentum_as("running_weight") if spec.momentum is not None and spec.track_running_stats else None
        )
        converters.convert(module, "onnx", opset=OPSET)  # warm-up
        nb_time, nb_model = median_seconds(
            lambda: converters.convert(module, "onnx", opset=OPSET), args.repeat_normbridge
        )
        torch_time, torch_model = median_seconds(lambda: torch_export(module, shape), args.repeat_anchor)
        model = keras_model(converters.from_spec(spec, "keras"), keras_shape(spec, shape))
        keras_time, keras_onnx = median_seconds(lambda: keras_export(model), args.repeat_anchor)
        native = all(node.op_type in NORM_OPS for node in nb_model.graph.node)
        rows.append(
            (
                kind,
                "normbridge",
                nb_time,
                1.0,
                op_summary(nb_model),
                verdict(spec.eps, expected_momentum, nb_model),
                native,
            )
        )
        rows.append(
            (
                kind,
                "torch.onnx(dynamo)",
                torch_time,
                torch_time / nb_time,
                op_summary(torch_model),
                verdict(spec.eps, expected_momentum, torch_model),
                None,
            )
        )
        rows.append(
            (
                kind,
                "keras.export(tf2onnx)",
                keras_time,
                keras_time / nb_time,
                op_summary(keras_onnx),
                verdict(spec.eps, expected_momentum, keras_onnx),
                None,
            )
        )

    print(
        f"one layer to ONNX, opset {OPSET}; medians of {args.repeat_normbridge} (normbridge) and {args.repeat_anchor} (anchors) runs"
    )
    print(f"{'kind':<9} {'tool':<22} {'median':>10} {'x slower':>9}  {'eps/momentum':<40} ops")
    for kind, tool, seconds, ratio, ops, check, _ in rows:
        print(f"{kind:<9} {tool:<22} {seconds * 1000:>8.2f}ms {ratio:>9.0f}  {check:<40} {ops[:70]}")
    torch_ratios = [r[3] for r in rows if r[1].startswith("torch")]
    nb_rows = [r for r in rows if r[1] == "normbridge"]
    print()
    print(
        f"speed-up versus torch.onnx.export: min {min(torch_ratios):.0f}x, median {statistics.median(torch_ratios):.0f}x (target >= 100x)"
    )
    print(
        f"normbridge native ops only: {all(r[6] for r in nb_rows)}; eps/momentum mismatches: normbridge {sum(r[5] != 'ok' for r in nb_rows)}, "
        f"anchors {sum(r[5] != 'ok' for r in rows if r[1] != 'normbridge')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
