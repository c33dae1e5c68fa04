"""TorchModelAdapter: torch.nn.Module networks and torch.export ExportedPrograms (.pt2) as whole models."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch

from schemas import NormSpec, UnsupportedObjectError
from schemas.kinds import KIND_INFO
from schemas.atomic_io import atomic_write_bytes

from ..api import layer_spec
from ..model_adapter import ModelAdapter
from ..model_values import LayerFacts, NormLayerRef
from . import artifact_contents, onnx_export, porting, recalibration, running, serving_taps, statistics
from .pt2 import structure
from .recognition import exported_program


def _load_pt2(path: Path) -> Any:
    """Never torch.export.load: it unpickles parts of the archive with the full unpickler (see pt2/archive.py)."""
    from .pt2.archive import load_exported_program

    return load_exported_program(path)


def _module(model: Any, expected: str) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise UnsupportedObjectError(f"got a {type(model).__module__}.{type(model).__qualname__}, expected {expected}.")
    return model


class TorchModelAdapter(ModelAdapter):
    """nn.Modules are walked with named_modules(); ExportedPrograms are read from their aten ops."""

    framework = "torch"
    walk_origin = "module"
    serving_source = True

    def own_eps_default(self, facts: LayerFacts) -> bool:
        """A hand-written class (LlamaRMSNorm) has its own default eps, not the stock class's."""
        return (
            facts.origin != "normbridge"
            and not facts.layer_type.startswith("aten")
            and facts.layer_type not in KIND_INFO[facts.kind].stock_classes("torch")
        )

    def load(self, path: Path) -> Any:
        if path.is_dir():  # a Hugging Face checkpoint folder (converters.models.loading sends only those here)
            from .checkpoint_folder import load_checkpoint_folder

            return load_checkpoint_folder(path)
        return _load_pt2(path)

    def prepare_loading(self) -> None:
        """torch's .pt2 deserializer and what it imports (torch._dynamo): about 2 s on a first load."""
        from . import torch_internals
        from .pt2 import archive, program_schema  # noqa: F401

        torch_internals.import_serializer()

    def load_bytes(self, data: bytes, name: str) -> Any:
        from .pt2.archive import load_exported_program

        return load_exported_program(Path(name), data)

    def save(self, model: Any, path: Path) -> None:
        if not exported_program.is_exported_program(model):
            raise UnsupportedObjectError(
                f"cannot write a recalibrated {type(model).__name__} to '{path}'; recalibrate a .pt2, .keras or .onnx model."
            )
        buffer = io.BytesIO()
        torch.export.save(model, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    # -- layers ----------------------------------------------------------------------------

    def norm_layers(self, model: Any) -> list[NormLayerRef]:
        """Definition order (named_modules), which is execution order for the sequential-style networks this targets."""
        from ..adapters import REGISTRY

        if not isinstance(model, torch.nn.Module):
            raise UnsupportedObjectError(
                f"got a {type(model).__name__}; expected a torch.nn.Module (call .module() on an ExportedProgram)."
            )
        framework = REGISTRY.framework("torch")
        found = []
        for path, module in model.named_modules():
            try:
                kind = framework.kind_of(module)
            except UnsupportedObjectError:
                continue
            found.append(
                NormLayerRef(path or type(module).__name__, module, "torch", kind, training=bool(module.training))
            )
        return found

    def layer_specs(self, model: Any, sample: Any = None) -> list[NormSpec]:
        if exported_program.is_exported_program(model):
            return exported_program.exported_specs(model)
        if sample is not None:
            return running.specs_in_execution_order(model, self.norm_layers(model), sample)
        return [layer_spec(ref) for ref in self.norm_layers(model)]

    def layer_spec(self, ref: NormLayerRef) -> NormSpec:
        return layer_spec(ref)

    def unused_layers(self, model: Any, sample: Any = None) -> frozenset[str]:
        """Read from the program's graph: a module is traced (torch.export, as torch.onnx does) on `sample` first."""
        if not exported_program.is_exported_program(model):
            if sample is None:
                return frozenset()
            try:
                model = torch.export.export(model, tuple(torch.as_tensor(a) for a in sample.arrays))
            except Exception:  # a module torch.export cannot trace: no layer is known to be unused
                return frozenset()
        return exported_program.unused_layers(model)

    def layer_facts(self, model: Any) -> list[LayerFacts]:
        if exported_program.is_exported_program(model):
            return exported_program.exported_facts(model)
        return super().layer_facts(_module(model, "a torch.nn.Module or a torch.export.ExportedProgram"))

    def model_hazards(self, model: Any, found: int | None = None) -> list:
        """Modules that look like normalizations but were not proved, and SyncBatchNorms (recognition/norm_hazards.py);
        `found` saves reading the layers again (a 160-RMSNorm program: 50 ms)."""
        from .recognition import norm_hazards

        if exported_program.is_exported_program(model):
            return norm_hazards.program_hazards(
                model, len(exported_program.exported_norm_layers(model)) if found is None else found
            )
        if isinstance(model, torch.nn.Module):
            return norm_hazards.module_hazards(model, len(self.norm_layers(model)) if found is None else found)
        return []

    def inspection_source(self, model: Any) -> str:
        if exported_program.is_exported_program(model):
            return "torch.export.ExportedProgram"
        return super().inspection_source(model)

    def describe(self, model: Any) -> str:
        return f"torch {type(model).__name__}"

    def artifact_contents(self, model: Any):
        if exported_program.is_exported_program(model):
            return artifact_contents.program_contents(model)
        from .checkpoint_folder import contents, meta_model

        folder_tensors = meta_model.tensors_of(model)
        if folder_tensors is not None:  # a checkpoint folder's model: its tensors streamed from the files
            return contents.folder_contents(model, folder_tensors, self.norm_layers(model))
        return artifact_contents.module_contents(model, self.norm_layers(model))

    def structure_of(self, model: Any, tensors, source=None):
        """A program's archive parts, or a checkpoint folder's files; an nn.Module built in Python has no structure
        normbridge can store safely: its state dict is what is kept."""
        if exported_program.is_exported_program(model):
            return structure.pt2_structure(model, tensors, source)
        from .checkpoint_folder import folder_structure, meta_model

        folder = meta_model.folder_of(model) if isinstance(model, torch.nn.Module) else None
        if folder is not None:
            return folder_structure.folder_structure(folder, meta_model.tensors_of(model))
        return None

    def folder_tensor_order(self, parts):
        from .checkpoint_folder import folder_structure

        return folder_structure.layout_order(parts)

    def write_model_folder(self, parts, tensors, target):
        from .checkpoint_folder import folder_structure

        return folder_structure.write_folder(parts, tensors, target)

    def check_model_folder(self, parts, tensors):
        from .checkpoint_folder import folder_structure

        folder_structure.check_folder_parts(parts, tensors)

    def load_model_folder(self, path):
        from .checkpoint_folder import meta_model

        return meta_model.load_pretrained(path)

    def load_runnable(self, path):
        from .checkpoint_folder import program

        return program.load_folder_program(path)

    def runnable(self, model):
        from .checkpoint_folder import program

        return program.folder_program(model) if program.is_transformers_model(model) else model

    def model_file(self, parts, tensors) -> bytes:
        return structure.pt2_file(parts, tensors)

    def write_model_file(self, parts, tensors, stream) -> None:
        structure.write_pt2(parts, tensors, stream)

    def tensor_order(self, parts, tensor_names) -> list[str]:
        return structure.pt2_tensor_order(parts, set(tensor_names))

    # -- porting ---------------------------------------------------------------------------

    def port_targets(self, model: Any) -> list[NormLayerRef]:
        if not isinstance(model, torch.nn.Module):
            raise UnsupportedObjectError(
                f"the target is a {type(model).__name__}, expected a torch.nn.Module to write into; an ExportedProgram has no layers "
                "to change, so build the nn.Module in Python and port into it."
            )
        return self.norm_layers(model)

    def plan_port_write(self, fresh, target, path, report):
        return porting.plan_write(fresh, target, path, report)

    def snapshot(self, layer):
        return porting.snapshot(layer)

    # -- running and serving ---------------------------------------------------------------

    def input_specs(self, model: Any):
        if exported_program.is_exported_program(model):
            return running.program_input_specs(model)
        raise UnsupportedObjectError(
            f"a {type(model).__name__} does not record its input shape; pass a sample (a NumPy array, or a .npy/.npz file) for it."
        )

    def source_runner(self, model: Any):
        if exported_program.is_exported_program(model):
            return running.program_runner(model)
        if isinstance(model, torch.nn.Module):
            return running.module_runner(model)
        return super().source_runner(model)

    def export_onnx(self, model: Any, sample: Any, opset: int):
        return onnx_export.export_onnx(model, sample, opset)

    # -- BatchNorm statistics --------------------------------------------------------------

    def batchnorm_moments(self, model: Any, batches, train: bool = False):
        if exported_program.is_exported_program(model):
            return statistics.program_moments(model, batches, train)
        if isinstance(model, torch.nn.Module) and not train:
            return statistics.module_moments(model, batches)
        raise UnsupportedObjectError(
            f"got a {type(model).__name__}; expected a torch.nn.Module, ExportedProgram, Keras model or ONNX model."
        )

    def recalibrate(self, model: Any, batches, variance_estimator: str):
        if exported_program.is_exported_program(model):
            return recalibration.recalibrate_program(model, batches, variance_estimator)
        if isinstance(model, torch.nn.Module):
            return recalibration.recalibrate_module(model, batches, variance_estimator)
        raise UnsupportedObjectError(f"got a {type(model).__name__}; expected a torch.nn.Module or ExportedProgram.")

    # -- serving -------------------------------------------------------------------------------

    def serving_taps(self, model: Any, sink):
        """Hooks on the module itself (it keeps serving; a GraphModule such as `ep.module()` also gets a tap before each
        batch-norm call of its graph), or the program's module() with a tap before each batch-norm op."""
        if exported_program.is_exported_program(model):
            return serving_taps.program_taps(model, sink)
        refs = [
            ref
            for ref in self.norm_layers(model)
            if ref.kind == "batch" and getattr(ref.obj, "running_mean", None) is not None
        ]
        if not refs and not serving_taps.has_graph_batchnorms(model):
            raise UnsupportedObjectError(
                f"{self.describe(model)} has no BatchNorm with running statistics for the recognizers to find; nothing to monitor."
            )
        eps = [
            float(ref.obj.eps) if isinstance(getattr(ref.obj, "eps", None), (int, float)) else layer_spec(ref).eps
            for ref in refs
        ]
        return serving_taps.module_taps(model, refs, sink, eps)
