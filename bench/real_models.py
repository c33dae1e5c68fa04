"""bench/models.py's real-architecture rows and its third Keras -> ONNX candidate (imported by models.py).

- A Llama-style decoder of about 100M parameters and a DETR-style detector (ResNet-50-shaped backbone with frozen
  BatchNorms, 6 + 6 transformer layers), built from transformers configs with random state: inspect, export for
  serving and register (the equivalence gate included) timed beside the bare exporter (torch.onnx.export of the same
  program), and the normalizations normbridge finds against those the model holds (its modules whose class name
  contains "Norm", counted from the module tree, not by normbridge).
- Keras 3's own export through the torch backend (torch.onnx), which needs another process: Keras picks its backend
  once, at import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

CHILD = """
import sys, numpy as np, keras
model = keras.models.load_model(sys.argv[1], safe_mode=True)
arrays = np.load(sys.argv[3])
model({k: arrays[k] for k in arrays.files} if len(arrays.files) > 1 else arrays[arrays.files[0]])
model.export(sys.argv[2], format="onnx", verbose=False)
"""


def export_through_torch_backend(model, sample, opset: int):
    """(onnx.ModelProto, exporter, notes): the model saved as .keras, loaded under KERAS_BACKEND=torch,
    keras.Model.export."""
    with tempfile.TemporaryDirectory() as folder:
        keras_path, onnx_path, npz = Path(folder) / "m.keras", Path(folder) / "m.onnx", Path(folder) / "x.npz"
        model.save(keras_path)
        np.savez(npz, **{name: a[:1] for name, a in zip(sample.names, sample.arrays)})
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(keras_path), str(onnx_path), str(npz)],
            capture_output=True,
            text=True,
            env={**os.environ, "KERAS_BACKEND": "torch"},
            timeout=1200,
        )
        if done.returncode != 0:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            errors = [line for line in lines if "Error" in line.split(":", 1)[0]] or lines[-1:] or ["no message"]
            raise RuntimeError(errors[-1][:200])
        return onnx.load(str(onnx_path)), "keras.Model.export (torch backend, torch.onnx)", []


def norm_modules(model: torch.nn.Module) -> int:
    """Modules whose class name contains 'Norm' and that hold no such module themselves: the normalizations present."""

    def is_norm(m):
        return "Norm" in type(m).__name__

    return sum(1 for m in model.modules() if is_norm(m) and not any(is_norm(c) for c in m.modules() if c is not m))


def llama_100m():
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
        rms_norm_eps=1e-5,
        use_cache=False,
    )
    return LlamaModel(config).eval(), (torch.randint(0, 32000, (1, 16)),)


def detr_detector():
    from transformers import DetrConfig, DetrModel, ResNetConfig

    torch.manual_seed(0)
    backbone = ResNetConfig(
        embedding_size=64,
        hidden_sizes=[256, 512, 1024, 2048],
        depths=[3, 4, 6, 3],
        layer_type="bottleneck",
        out_features=["stage4"],
    )
    config = DetrConfig(
        use_timm_backbone=False,
        use_pretrained_backbone=False,
        backbone_config=backbone,
        d_model=256,
        encoder_layers=6,
        decoder_layers=6,
        num_queries=100,
    )
    return DetrModel(config).eval(), (torch.randn(1, 3, 224, 224),)


def randomise_norms(model: torch.nn.Module) -> None:
    """Every 1-D floating state tensor drawn from U(0.5, 1.5): identity statistics would hide misreadings."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if tensor.is_floating_point() and tensor.dim() == 1:
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)


def real_case(label: str, build, folder: Path, timed) -> list[tuple]:
    """Rows for one transformers model: load, inspect, bare exporter, normbridge export, register; found vs present."""
    import warnings

    from converters.models.inspection import inspect_model
    from converters.models.loading import load_model
    from converters.models.serving.export import export_for_serving
    from registry.service import Registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, args = build()
        randomise_norms(model)
        start = time.perf_counter()
        program = torch.export.export(model, args)
        export_seconds = time.perf_counter() - start
    pt2 = folder / f"{label.split()[0]}.pt2"
    torch.export.save(program, pt2)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    load_time, loaded = timed(lambda: load_model(pt2), 1)
    inspect_time, inspection = timed(lambda: inspect_model(loaded), 1)
    sample = [a.numpy() for a in args]
    bare_time, _ = timed(
        lambda: torch.onnx.export(
            loaded, args, str(folder / "bare.onnx"), dynamo=True, opset_version=23, external_data=False
        ),
        1,
    )
    full_time, result = timed(lambda: export_for_serving(loaded, folder / "served.onnx", force=True, sample=sample), 1)
    registry = Registry(db=f"sqlite:///{folder / f'{label.split()[0]}.db'}", blobs=str(folder / "blobs"), user="bench")
    register_time, registration = timed(lambda: registry.register(label.split()[0].lower(), pt2), 1)
    present, found = norm_modules(model), len(inspection.layers)
    verified = len({v.source_layer for v in result.verification if v.source_layer})
    passed = sum(c.passed for c in registration.checks)
    return [
        (label, f"torch.export ({params:.0f}M parameters)", export_seconds, None, ""),
        (label, "load .pt2", load_time, None, ""),
        (label, "inspect (after load)", inspect_time, None, f"{found} found / {present} present"),
        (label, "bare torch.onnx.export", bare_time, 1.0, ""),
        (
            label,
            "normbridge export (verify+rewrite+contract)",
            full_time,
            full_time / bare_time,
            f"{verified} verified, passed={result.passed}",
        ),
        (
            label,
            "normbridge register (.pt2, gate included)",
            register_time,
            register_time / bare_time,
            f"{passed}/{len(registration.checks)} checked, {len(registration.unrecognised)} unrecognised",
        ),
    ]


def real_cases(folder: Path, timed) -> list[tuple]:
    return real_case("Llama-100M decoder", llama_100m, folder, timed) + real_case(
        "DETR-R50 detector", detr_detector, folder, timed
    )


__all__ = ["export_through_torch_backend", "norm_modules", "real_cases"]
