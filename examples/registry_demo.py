"""The registry quickstart: register a trained CNN, fine-tune only its BatchNorm statistics, register again,
diff, lineage, export.

Runs on the embedded defaults (SQLite + a local blobs folder) in a temporary NORMBRIDGE_HOME,
so it needs no configuration and leaves nothing behind. `make demo` runs it after the layer quickstart.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.framework_noise import configure  # noqa: E402  (before any framework loads: TensorFlow's start-up lines)

configure(verbose=False)  # what the CLI does, for the worker processes the registry starts too (as in quickstart.py)

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

console = Console()
logging.getLogger("torch.onnx").setLevel(
    logging.ERROR
)  # the exporter's notes about torchvision ops this model does not use
warnings.filterwarnings("ignore", category=FutureWarning)


class SmallCNN(torch.nn.Module):
    """Two Conv-BatchNorm-ReLU blocks and a linear head: small enough for a demo, real enough to fine-tune."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(16, eps=1e-3, momentum=0.01),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
        )
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.features(x))


def train(model: SmallCNN, steps: int, generator: torch.Generator) -> None:
    """A few SGD steps on a seeded synthetic task (weights and statistics both move)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    for _ in range(steps):
        x = torch.randn(16, 3, 16, 16, generator=generator)
        y = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0].mean(dim=(1, 2)) > 0).long()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


@torch.no_grad()
def recalibrate_statistics(model: SmallCNN, batches: int, generator: torch.Generator) -> None:
    """Fine-tune only the running statistics: weights frozen, forward passes in train mode on shifted data."""
    for p in model.parameters():
        p.requires_grad_(False)
    model.train()
    for _ in range(batches):
        model(torch.randn(16, 3, 16, 16, generator=generator) * 1.5 + 0.3)
    model.eval()


def register(registry, name: str, model, **kwargs):
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(f"registering {name}", total=1)
        result = registry.register(
            name,
            model,
            progress=lambda step, done, total: bar.update(
                task, description=f"{name}: {step}", completed=done, total=max(total, 1)
            ),
            **kwargs,
        )
    v = result.version
    verdict = "registered" if result.created else "already registered as"
    console.print(
        f"[green]{verdict}[/] {v.model}@{v.number}  ({v.operation}{' from ' + v.parent if v.parent else ''}; "
        f"{sum(c.passed for c in result.checks)}/{len(result.checks)} layers passed the equivalence check)",
        highlight=False,
        soft_wrap=True,
    )
    return result


def main() -> None:
    from converters.models.serving.export import export_for_serving
    from registry.service import Registry

    with tempfile.TemporaryDirectory(prefix="normbridge-registry-demo-") as home:
        os.environ["NORMBRIDGE_HOME"] = home
        os.environ.pop("NORMBRIDGE_DB", None)
        os.environ.pop("NORMBRIDGE_BLOBS", None)
        registry = Registry(user="demo")
        console.rule("train a small CNN and register it")
        console.print(f"store: {registry.db_url} + {registry.blob_uri}", highlight=False, soft_wrap=True)
        generator = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        model = SmallCNN()
        train(model, steps=5, generator=generator)
        register(registry, "cnn", model, note="5 SGD steps")

        console.rule("fine-tune only the BatchNorm statistics, register again")
        recalibrate_statistics(model, batches=10, generator=generator)
        before = set(registry.store.digests())
        second = register(registry, "cnn", model, note="statistics on shifted data", operation="recalibrated")
        register(registry, "cnn", model)  # identical content: the existing version comes back
        added = set(registry.store.digests()) - before
        full = sum(t["nbytes"] for t in second.version.manifest["tensors"].values())
        console.print(
            f"cnn@2 stored {len(added)} new blobs, {sum(registry.store.size(d) for d in added)} bytes (its {len(second.version.manifest['tensors'])} "
            f"tensors hold {full} bytes; the unchanged weights are shared with cnn@1)",
            highlight=False,
            soft_wrap=True,
        )

        console.rule("diff cnn@1 cnn@2")
        console.print(registry.diff("cnn@1", "cnn@2").render_text(), highlight=False, markup=False, soft_wrap=True)

        console.rule("lineage cnn@2")
        console.print(registry.lineage("cnn@2").render_text(), highlight=False, markup=False, soft_wrap=True)
        registry.set_alias("cnn", "production", "cnn@2")

        console.rule("export cnn@production to ONNX with the serving contract")
        restored = SmallCNN()
        tensors = registry.tensors("cnn@production")
        restored.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()})
        restored.eval()
        sample = torch.randn(4, 3, 16, 16, generator=generator)
        result = export_for_serving(restored, Path(home) / "cnn.onnx", sample=sample)
        contract = result.contract
        worst = max((o.max_abs_error or 0.0) for o in contract.outputs) if contract else float("nan")
        console.print(
            f"exporter {result.exporter}, opset {result.opset}: {len(result.verification)} normalization settings verified, "
            f"contract {'PASSED' if contract and contract.passed else 'FAILED'} (max abs error {worst:.2e}); wrote {Path(result.path).name}",
            highlight=False,
            soft_wrap=True,
        )

        console.rule("verify and audit")
        check = registry.verify()
        console.print(check.render_text(), highlight=False, markup=False, soft_wrap=True)
        for entry in registry.audit():
            where = entry.model if entry.number is None else f"{entry.model}@{entry.number}"
            console.print(
                f"  {entry.seq:>2} {entry.action:<18} {where:<10} by {entry.user}  {entry.hash[:12]}", highlight=False
            )
        problems = registry.verify_audit()
        console.print(
            "[green]audit hash chain intact[/]" if not problems else f"[red]audit chain broken: {problems}[/]"
        )


if __name__ == "__main__":
    main()
