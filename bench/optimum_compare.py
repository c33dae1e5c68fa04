"""Benchmark: what `optimum-cli export onnx` writes for a checkpoint folder, beside `normbridge export` (issue 33).

For each Hugging Face checkpoint folder (built here offline from a small config with random init and randomized
normalization states, saved with `save_pretrained`), both exporters run as a user runs them, each a cold process timed
by wall clock: `optimum-cli export onnx -m DIR --task feature-extraction OUT/` (its default opset, with its own
validation) and `normbridge export DIR --to onnx -o model.onnx` (its verification and contract;
NORMBRIDGE_GATE_WORKER=private, so no warm worker from a previous run helps it). Then, for each file:

- which normalizations survive as native ONNX ops (RMSNormalization, LayerNormalization, BatchNormalization) and
  which were decomposed (an `Add` of a constant feeding a `Sqrt`, the eps of `x / sqrt(var + eps)`) or folded into
  `Conv` (the model has BatchNorms and the file none);
- whether eps is exact: each native op's `epsilon` attribute (ONNX's default 1e-5 when absent) and each
  decomposition's Add constant, compared bit for bit with float32 of the eps of the model's normalization modules
  (ConvNeXt's block norms have an eps of 1e-6 fixed in transformers' code, not the config's);
- the largest absolute difference between what onnxruntime computes from the file and what the torch model
  transformers loads from the same folder computes, on the same input (the first output: last_hidden_state);
- the number of outputs (optimum's feature-extraction file has last_hidden_state only; its pooler is left out).

CPU seconds are those of the process and the children it waited for; wall seconds move with other jobs' load.

It runs under a venv holding optimum-onnx (which needs transformers < 4.58) and calls normbridge from the project's
venv, whose transformers 5 reads the folders transformers 4.57 writes:

    python3.11 -m venv /tmp/venv-optimum
    /tmp/venv-optimum/bin/pip install -c constraints.txt torch==2.13.0
    /tmp/venv-optimum/bin/pip install "transformers>=4.56,<4.58" optimum-onnx onnx onnxruntime
    HF_HUB_OFFLINE=1 /tmp/venv-optimum/bin/python bench/optimum_compare.py [--rounds 3] [--also-opset 23] \
        [--only llama,bert] [--tmp DIR]   # a --tmp folder is kept; else --keep keeps the temporary one
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
NORMBRIDGE = os.environ.get("NORMBRIDGE", str(ROOT / ".venv" / "bin" / "normbridge"))
OPTIMUM_CLI = os.environ.get("OPTIMUM_CLI", str(Path(sys.executable).parent / "optimum-cli"))
NATIVE = (
    "RMSNormalization",
    "LayerNormalization",
    "BatchNormalization",
    "GroupNormalization",
    "InstanceNormalization",
    "SimplifiedLayerNormalization",
    "SkipLayerNormalization",
)
DEFAULT_EPS = 1e-5  # the epsilon attribute's default in ONNX's normalization ops
BATCH, TOKENS, SIDE = 2, 8, 64  # normbridge traces pixels of 64 where the config gives no image_size (ResNet)


# ---------------------------------------------------------------------------------------------------- the folders
def _randomize_norms(model: torch.nn.Module, generator: torch.Generator) -> int:
    """Random scale/shift and running statistics for every normalization, so a wrong eps or a dropped term shows."""
    count = 0
    for module in model.modules():
        name = type(module).__name__
        if not ("Norm" in name or isinstance(module, torch.nn.modules.batchnorm._BatchNorm)):
            continue
        with torch.no_grad():
            weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
            if isinstance(weight, torch.Tensor):
                weight.copy_(1.0 + 0.3 * torch.randn(weight.shape, generator=generator))
            if isinstance(bias, torch.Tensor):
                bias.copy_(0.3 * torch.randn(bias.shape, generator=generator))
            if isinstance(getattr(module, "running_mean", None), torch.Tensor):
                module.running_mean.copy_(0.2 * torch.randn(module.running_mean.shape, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator))
        count += 1
    return count


def _models():
    """name -> (model class, config, the config attribute holding eps or None, the eps) of each folder."""
    import transformers as tf

    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return {
        "llama": (
            tf.LlamaModel,
            tf.LlamaConfig(**small, num_key_value_heads=2, vocab_size=128, rms_norm_eps=3e-6),
            "rms_norm_eps",
        ),
        "gemma": (
            tf.GemmaModel,
            tf.GemmaConfig(**small, num_key_value_heads=1, head_dim=16, vocab_size=128, rms_norm_eps=2e-6),
            "rms_norm_eps",
        ),
        "bert": (tf.BertModel, tf.BertConfig(**small, vocab_size=128, layer_norm_eps=4e-12), "layer_norm_eps"),
        "vit": (
            tf.ViTModel,
            tf.ViTConfig(**small, image_size=SIDE, patch_size=8, layer_norm_eps=7e-7),
            "layer_norm_eps",
        ),
        "resnet": (
            tf.ResNetModel,
            tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"),
            None,
        ),
        "convnext": (
            tf.ConvNextModel,
            tf.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=SIDE, layer_norm_eps=5e-6),
            "layer_norm_eps",
        ),
    }


def build(folder: Path, name: str) -> str:
    """Write the checkpoint folder `name` with save_pretrained; returns its config's eps setting (key=value)."""
    cls, config, key = _models()[name]
    torch.manual_seed(0)
    model = cls(config).eval()
    count = _randomize_norms(model, torch.Generator().manual_seed(1))
    if not count:
        raise SystemExit(f"{name}: no normalization found to randomize")
    model.save_pretrained(folder, safe_serialization=True)
    return f"{key}={getattr(config, key):g}" if key else "none (BatchNorm2d's 1e-5)"


def norm_modules(model: torch.nn.Module) -> tuple[dict[str, int], list[float]]:
    """class name -> count of the model's normalization modules, and each one's eps (`eps` or `variance_epsilon`)."""
    counts: dict[str, int] = {}
    eps = []
    for module in model.modules():
        name = type(module).__name__
        if "Norm" in name and not list(module.children()):
            counts[name] = counts.get(name, 0) + 1
            eps.append(float(getattr(module, "eps", getattr(module, "variance_epsilon", float("nan")))))
    return counts, eps


# ---------------------------------------------------------------------------------------------------- the exports
def cold(command: list[str], env: dict[str, str]) -> tuple[tuple[float, float], str]:
    """(wall, CPU) seconds of one cold process (CPU: user + system of it and the children it waited for), and its last
    output line when it failed ('' when it succeeded). CPU seconds hardly move with other jobs' load on the cores."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        return (wall, cpu), f"exit {done.returncode}: {lines[-1] if lines else ''}"[:300]
    return (wall, cpu), ""


def export_optimum(folder: Path, out: Path, env: dict[str, str], opset: int | None = None):
    """optimum-cli's export of the folder into the directory `out` (its default opset unless `opset`)."""
    shutil.rmtree(out, ignore_errors=True)
    command = [OPTIMUM_CLI, "export", "onnx", "-m", str(folder), "--task", "feature-extraction", str(out)]
    timing, error = cold(command + (["--opset", str(opset)] if opset else []), env)
    return timing, error, out / "model.onnx"


def export_normbridge(folder: Path, out: Path, env: dict[str, str]):
    out.unlink(missing_ok=True)
    timing, error = cold([NORMBRIDGE, "export", str(folder), "--to", "onnx", "-o", str(out)], env)
    return timing, error, out


# ---------------------------------------------------------------------------------------------------- the files
@dataclass
class FileFacts:
    opset: int = 0
    native: dict[str, int] = field(default_factory=dict)  # op type -> count
    native_eps: list[float] = field(default_factory=list)
    decomposed: int = 0  # Add(const) -> Sqrt chains
    decomposed_eps: list[float] = field(default_factory=list)
    batchnorm_nodes: int = 0
    conv_nodes: int = 0
    outputs: int = 0


def _nodes(graph):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.g is not None and attribute.g.node:
                yield from _nodes(attribute.g)


def file_facts(path: Path) -> FileFacts:
    """What the ONNX file at `path` holds of normalization: native ops with their eps, decompositions with theirs."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    facts = FileFacts(
        opset=max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), outputs=len(model.graph.output)
    )
    nodes = list(_nodes(model.graph))
    for function in model.functions:
        nodes.extend(function.node)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {}
    for node in nodes:
        for output in node.output:
            producer[output] = node
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    constants[node.output[0]] = numpy_helper.to_array(attribute.t)
                elif attribute.name == "value_float":
                    constants[node.output[0]] = np.float32(attribute.f)
    for node in nodes:
        if node.op_type in NATIVE:
            facts.native[node.op_type] = facts.native.get(node.op_type, 0) + 1
            eps = next((a.f for a in node.attribute if a.name == "epsilon"), DEFAULT_EPS)
            facts.native_eps.append(float(np.float32(eps)))
        facts.batchnorm_nodes += node.op_type == "BatchNormalization"
        facts.conv_nodes += node.op_type == "Conv"
        if node.op_type == "Sqrt":
            add = producer.get(node.input[0])
            if add is not None and add.op_type == "Add":
                values = [constants[i] for i in add.input if i in constants]
                if len(values) == 1 and np.asarray(values[0]).size == 1:
                    facts.decomposed += 1
                    facts.decomposed_eps.append(float(np.asarray(values[0]).reshape(())))
    return facts


def eps_verdict(values: list[float], module_eps: list[float], folded: bool) -> str:
    """'exact' when every eps in the file is float32 of a distinct module's eps, bit for bit; else the values off."""
    if not values:
        return "not in the file (folded)" if folded else "none found"
    left = [np.float32(e).tobytes() for e in module_eps]
    wrong = []
    for value in values:
        bits = np.float32(value).tobytes()
        if bits in left:
            left.remove(bits)
        else:
            wrong.append(value)
    return "exact" if not wrong else "NOT exact: " + ", ".join(f"{v:.9g}" for v in sorted(set(wrong)))


def eps_summary(module_eps: list[float]) -> str:
    """'1e-06 x4, 5e-06 x1': the models' eps values and how many normalizations hold each."""
    counts: dict[float, int] = {}
    for value in module_eps:
        counts[value] = counts.get(value, 0) + 1
    return ", ".join(f"{value:g} x{n}" for value, n in sorted(counts.items()))


def feeds(session, name: str, vocab: int) -> dict[str, np.ndarray]:
    """The same input for every file: 2 sequences of 8 token ids (mask ones, types zeros), or 2 random images."""
    generator = np.random.default_rng(0)
    ids = generator.integers(0, vocab, (BATCH, TOKENS)).astype(np.int64)
    pixels = generator.standard_normal((BATCH, 3, SIDE, SIDE)).astype(np.float32)
    values = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
        "position_ids": np.tile(np.arange(TOKENS, dtype=np.int64), (BATCH, 1)),
        "pixel_values": pixels,
    }
    out = {}
    for item in session.get_inputs():
        if item.name not in values:
            raise SystemExit(f"{name}: the ONNX file wants an input '{item.name}' this benchmark does not make")
        out[item.name] = values[item.name]
    return out


def reference(folder: Path, name: str) -> tuple[dict[str, np.ndarray], np.ndarray, tuple[dict[str, int], list[float]]]:
    """The inputs and the torch model's last_hidden_state, with the model transformers loads from the folder."""
    cls, config, _ = _models()[name]
    model = cls.from_pretrained(folder).eval()
    generator = np.random.default_rng(0)
    ids = generator.integers(0, getattr(config, "vocab_size", 1), (BATCH, TOKENS))
    pixels = generator.standard_normal((BATCH, 3, SIDE, SIDE)).astype(np.float32)
    if cls.main_input_name == "pixel_values":
        inputs = {"pixel_values": torch.from_numpy(pixels)}
    else:
        inputs = {"input_ids": torch.from_numpy(ids.astype(np.int64))}
    with torch.no_grad():
        output = model(**inputs)[0].numpy()
    return inputs, output, norm_modules(model)


def max_error(path: Path, name: str, expected: np.ndarray) -> str:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    vocab = getattr(_models()[name][1], "vocab_size", 1)
    try:
        got = session.run(None, feeds(session, name, vocab))[0]
    except Exception as error:  # noqa: BLE001 - one line in the table, not a traceback
        return f"did not run: {str(error).splitlines()[0][:120]}"
    if got.shape != expected.shape:
        return f"shape {got.shape} != torch's {expected.shape}"
    return f"{float(np.max(np.abs(got.astype(np.float64) - expected))):.2e}"


# ---------------------------------------------------------------------------------------------------- the table
def describe(facts: FileFacts, modules: dict[str, int]) -> str:
    has_batchnorm = any("BatchNorm" in k for k in modules)
    parts = [f"{n} {op}" for op, n in sorted(facts.native.items())]
    if facts.decomposed:
        parts.append(f"{facts.decomposed} decomposed (Add eps, Sqrt)")
    if has_batchnorm and not facts.batchnorm_nodes:
        parts.append(f"BatchNorms folded into {facts.conv_nodes} Conv")
    return "; ".join(parts) or "none found"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="cold runs of each export; the median is shown")
    parser.add_argument("--tmp", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--only", default="", help="comma-separated subset of: " + ",".join(_models()))
    parser.add_argument(
        "--also-opset",
        type=int,
        default=None,
        help="also run optimum-cli with --opset N (e.g. 23, where RMSNormalization exists)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    import onnxruntime
    import optimum.version
    import transformers

    work = args.tmp or Path(tempfile.mkdtemp(prefix="optimum-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        NORMBRIDGE_GATE_WORKER="private",
        NORMBRIDGE_WORKER_DIR=str(work / "workers"),
        TOKENIZERS_PARALLELISM="false",
    )
    names = [n for n in _models() if not args.only or n in args.only.split(",")]
    nb_version = subprocess.run([NORMBRIDGE, "--version"], capture_output=True, text=True).stdout.strip()
    print(
        f"torch {torch.__version__}; optimum {optimum.version.__version__}, transformers {transformers.__version__}, "
        f"onnxruntime {onnxruntime.__version__} (this venv); normbridge: {NORMBRIDGE} ({nb_version or '?'})"
    )
    print(f"{args.rounds} cold run(s) of each export; load average {os.getloadavg()}")
    rows = []
    for name in names:
        folder = work / name
        shutil.rmtree(folder, ignore_errors=True)
        setting = build(folder, name)
        _, expected, (modules, module_eps) = reference(folder, name)
        norms = ", ".join(f"{n} {k}" for k, n in modules.items()) + f" (eps {eps_summary(module_eps)})"
        print(f"  {name}: {norms}; config {setting}", flush=True)
        exporters = [
            ("optimum-cli", export_optimum, work / f"{name}-optimum"),
            ("normbridge", export_normbridge, work / f"{name}-normbridge.onnx"),
        ]
        if args.also_opset:
            exporters.insert(
                1,
                (
                    f"optimum-cli --opset {args.also_opset}",
                    functools.partial(export_optimum, opset=args.also_opset),
                    work / f"{name}-optimum-{args.also_opset}",
                ),
            )
        for tool, export, out in exporters:
            timings, error, path = [], "", None
            for _ in range(args.rounds):
                timing, error, path = export(folder, out, env)
                timings.append(timing)
                if error:
                    break
            walls = [w for w, _ in timings]
            wall = f"{statistics.median(walls):.1f}" + (
                f" ({' '.join(f'{w:.1f}' for w in walls)})" if len(walls) > 1 else ""
            )
            wall += f" / {statistics.median(c for _, c in timings):.1f}"
            if error:
                rows.append((name, norms, tool, "-", "-", error, "-", "-", wall))
            else:
                facts = file_facts(path)
                folded = any("BatchNorm" in k for k in modules) and not facts.batchnorm_nodes
                rows.append(
                    (
                        name,
                        norms,
                        tool,
                        facts.opset,
                        describe(facts, modules),
                        eps_verdict(facts.native_eps + facts.decomposed_eps, module_eps, folded),
                        facts.outputs,
                        max_error(path, name, expected),
                        wall,
                    )
                )
            print("  " + " | ".join(map(str, rows[-1])), flush=True)
    header = (
        "model",
        "its normalizations",
        "exporter",
        "opset",
        "normalization in the file",
        "eps",
        "outputs",
        "max abs err",
        "export wall s (rounds) / CPU s",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")
    print(f"load average at the end {os.getloadavg()}")
    if not args.keep and args.tmp is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
