"""Benchmark: inspect, export-for-serving and contract-test a keras.applications ResNet50 (weights=None)
and a hand-written PyTorch ResNet-18, each step timed against the bare exporter, in one run.

Targets (issue 3): inspect under 0.5 s beyond model loading; export with verification, rewrite
and contract tests at most 2x the bare exporter. Then, in cold processes as a user runs them (issue
15): `normbridge inspect` of the .pt2 and of the .keras against a bare `torch.export.load` and a bare
`keras.saving.load_model` of the same file in a fresh process (target: within 1.5x), median of
--cold-repeat runs.

    python bench/models.py [--repeat 1] [--size 224] [--cold-repeat 3]
    python bench/models.py --keras-exporters [--size 32]   # the Keras -> ONNX candidates side by side
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import statistics
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

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402

from bench.cold import BARE_KERAS_LOAD, BARE_TORCH_LOAD, median_seconds, normbridge  # noqa: E402
from converters.models.serving.contract import contract_test  # noqa: E402
from converters.models.inspection import inspect_model  # noqa: E402
from converters.models.loading import load_model  # noqa: E402
from converters.models.serving.export import export_for_serving  # noqa: E402
from testkit.model_zoo import torch_resnet18, train_batchnorm_statistics  # noqa: E402

# bench/, the script's folder, is on sys.path
from real_models import export_through_torch_backend, real_cases  # noqa: E402


def timed(fn, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bare_torch_export(module: torch.nn.Module, sample: np.ndarray, path: Path) -> onnx.ModelProto:
    torch.onnx.export(
        module, (torch.from_numpy(sample),), str(path), dynamo=True, opset_version=23, external_data=False
    )
    return onnx.load(str(path))


def bare_keras_export(model, path: Path) -> onnx.ModelProto:
    model.export(str(path), format="onnx", verbose=False)
    return onnx.load(str(path))


def norm_ops(model: onnx.ModelProto) -> str:
    ops = [n.op_type for n in model.graph.node if n.op_type.endswith("Normalization")]
    return f"{len(ops)} native norm ops"


def torch_case(size: int, repeat: int, folder: Path) -> list[tuple]:
    torch.manual_seed(0)
    module = torch_resnet18(num_classes=10)
    train_batchnorm_statistics(module, [torch.randn(4, 3, size, size) for _ in range(2)])
    sample = np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32)
    program = torch.export.export(module, (torch.from_numpy(sample),))
    pt2 = folder / "resnet18.pt2"
    torch.export.save(program, str(pt2))
    load_time, loaded = timed(lambda: load_model(pt2), repeat)
    inspect_time, inspection = timed(lambda: inspect_model(loaded), repeat)
    timed(
        lambda: bare_torch_export(module, sample, folder / "warmup18.onnx"), 1
    )  # warm-up: first-call costs out of both timings
    bare_time, bare = timed(lambda: bare_torch_export(module, sample, folder / "bare18.onnx"), repeat)
    full_time, result = timed(lambda: export_for_serving(module, folder / "served18.onnx", sample=sample), repeat)
    contract_time, _ = timed(
        lambda: contract_test(
            module, result.path if hasattr(result, "path") else folder / "served18.onnx", sample=sample
        ),
        repeat,
    )
    served = onnx.load(str(folder / "served18.onnx"))
    return [
        ("torch ResNet-18", "load .pt2", load_time, None, ""),
        ("torch ResNet-18", "inspect (after load)", inspect_time, None, f"{len(inspection.layers)} layers"),
        ("torch ResNet-18", "bare torch.onnx.export", bare_time, 1.0, norm_ops(bare)),
        (
            "torch ResNet-18",
            "normbridge export (verify+contract)",
            full_time,
            full_time / bare_time,
            f"{norm_ops(served)}, passed={result.passed}",
        ),
        ("torch ResNet-18", "contract test alone", contract_time, contract_time / bare_time, ""),
    ]


def keras_case(size: int, repeat: int, folder: Path) -> list[tuple]:
    import keras

    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=10)
    sample = np.random.default_rng(0).standard_normal((2, size, size, 3)).astype(np.float32)
    model(sample)
    path = folder / "resnet50.keras"
    model.save(path)
    load_time, loaded = timed(lambda: load_model(path), repeat)
    loaded(sample)
    inspect_time, inspection = timed(lambda: inspect_model(loaded), repeat)
    timed(lambda: bare_keras_export(loaded, folder / "warmup50.onnx"), 1)  # warm-up: tracing costs out of both timings
    bare_time, bare = timed(lambda: bare_keras_export(loaded, folder / "bare50.onnx"), repeat)
    full_time, result = timed(lambda: export_for_serving(loaded, folder / "served50.onnx", sample=sample), repeat)
    contract_time, _ = timed(lambda: contract_test(loaded, folder / "served50.onnx", sample=sample), repeat)
    served = onnx.load(str(folder / "served50.onnx"))
    return [
        ("keras ResNet50", "load .keras", load_time, None, ""),
        ("keras ResNet50", "inspect (after load)", inspect_time, None, f"{len(inspection.layers)} layers"),
        ("keras ResNet50", "bare model.export(onnx)", bare_time, 1.0, norm_ops(bare)),
        (
            "keras ResNet50",
            "normbridge export (verify+rewrite+contract)",
            full_time,
            full_time / bare_time,
            f"{norm_ops(served)}, passed={result.passed}",
        ),
        ("keras ResNet50", "contract test alone", contract_time, contract_time / bare_time, ""),
    ]


def cold_inspect_rows(folder: Path, repeat: int) -> list[tuple]:
    """`normbridge inspect` of the files torch_case and keras_case wrote, against the bare loader,
    each in a fresh process."""
    rows = []
    for model, path, bare in (
        ("torch ResNet-18", folder / "resnet18.pt2", BARE_TORCH_LOAD),
        ("keras ResNet50", folder / "resnet50.keras", BARE_KERAS_LOAD),
    ):
        loader = median_seconds(lambda i: [sys.executable, "-c", bare, str(path)], repeat)
        inspect = median_seconds(lambda i: normbridge("inspect", str(path)), repeat)
        name = "torch.export.load" if path.suffix == ".pt2" else "keras.saving.load_model"
        rows.append((model, f"cold: bare {name} process", loader.wall, 1.0, f"cpu {loader.cpu:.2f} s"))
        rows.append(
            (
                model,
                "cold: normbridge inspect process",
                inspect.wall,
                inspect.wall / loader.wall,
                f"cpu {inspect.cpu:.2f} s = {inspect.cpu / loader.cpu:.2f}x; target <= 1.5x",
            )
        )
    return rows


def keras_exporter_models(size: int) -> list[tuple[str, object]]:
    """The real Keras models every exporter candidate is tried on (random init, small inputs)."""
    import keras
    import keras_hub

    models = [
        (name, getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3)))
        for name in ("ConvNeXtTiny", "EfficientNetB0", "MobileNetV3Small")
    ]
    models.append(
        (
            "keras_hub GemmaBackbone",
            keras_hub.models.GemmaBackbone(
                vocabulary_size=128,
                num_layers=2,
                num_query_heads=4,
                num_key_value_heads=1,
                hidden_dim=64,
                intermediate_dim=128,
                head_dim=16,
            ),
        )
    )
    return models


def keras_exporters(size: int) -> None:
    """Each Keras -> ONNX candidate on each model: success, seconds, graph inputs,
    normalizations the raw graph keeps, contract."""
    from converters.keras_adapter import onnx_export
    from converters.models.serving.samples import as_sample, input_specs
    from converters.onnx_adapter.graph.sites import find_norm_sites

    candidates = [
        ("keras.Model.export (tf2onnx)", onnx_export.export_with_keras),
        ("normbridge trace + tf2onnx", onnx_export.export_onnx),
        ("keras.Model.export (torch backend)", export_through_torch_backend),
    ]
    print(
        f"{'model':<24} {'exporter':<34} {'ok':<4} {'seconds':>8} {'inputs':>7} {'norms':>6} {'contract':<9} notes",
        flush=True,
    )
    for name, model in keras_exporter_models(size):
        sample = as_sample(None, input_specs(model))
        expected = len(sample.arrays)
        for label, export in candidates:
            start = time.perf_counter()
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    exported = export(model, sample, 23)[0]
            except Exception as error:  # a failing candidate is a row, not the end of the run
                print(
                    f"{name:<24} {label:<34} {'no':<4} {time.perf_counter() - start:>8.1f} {'-':>7} {'-':>6} {'-':<9} {str(error)[:90]}",
                    flush=True,
                )
                continue
            seconds = time.perf_counter() - start
            inputs, sites = len(exported.graph.input), len(find_norm_sites(exported))
            try:
                passed = str(contract_test(model, exported, sample).passed)
            except Exception as error:
                passed = f"error: {str(error)[:60]}"
            note = "" if inputs == expected else f"{inputs - expected} extra graph input(s)"
            print(
                f"{name:<24} {label:<34} {'yes':<4} {seconds:>8.1f} {inputs:>7} {sites:>6} {passed:<9} {note}",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--size", type=int, default=224, help="input height/width")
    parser.add_argument(
        "--keras-exporters", action="store_true", help="compare the Keras -> ONNX exporter candidates instead"
    )
    parser.add_argument(
        "--cold-repeat", type=int, default=3, help="cold processes per inspect and bare-loader row (0: skip them)"
    )
    parser.add_argument(
        "--real",
        choices=("with", "only", "without"),
        default="with",
        help="the transformers rows (Llama-100M decoder, DETR-R50 detector): with the ResNets, alone, or not",
    )
    args = parser.parse_args()
    if args.keras_exporters:
        keras_exporters(args.size)
        return 0
    rows: list[tuple] = []
    with tempfile.TemporaryDirectory() as folder:
        if args.real != "only":
            rows += torch_case(args.size, args.repeat, Path(folder))
            rows += keras_case(args.size, args.repeat, Path(folder))
            if args.cold_repeat:
                rows += cold_inspect_rows(Path(folder), args.cold_repeat)
        if args.real != "without":
            rows += real_cases(Path(folder), timed)
    print(
        f"whole models, input {args.size}x{args.size} (transformers rows: 16 tokens, 224x224), median of {args.repeat} run(s)"
    )
    print(f"{'model':<19} {'step':<44} {'seconds':>9} {'x bare':>7}  notes")
    for model, step, seconds, ratio, notes in rows:
        print(f"{model:<19} {step:<44} {seconds:>9.3f} {'' if ratio is None else f'{ratio:.2f}':>7}  {notes}")
    print()
    for model in ("torch ResNet-18", "keras ResNet50") if args.real != "only" else ():
        inspect = next(r for r in rows if r[0] == model and r[1].startswith("inspect"))
        export = next(r for r in rows if r[0] == model and r[1].startswith("normbridge export"))
        print(
            f"{model}: inspect {inspect[2]:.3f} s beyond loading (target < 0.5 s); export {export[3]:.2f}x the bare exporter (target <= 2x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
