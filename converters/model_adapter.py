"""`ModelAdapter`: one framework's whole models, for the framework-neutral tools in converters/models/.

Loading, walking, reading specs and facts, running, exporting to ONNX, collecting BatchNorm
input statistics, recalibrating, writing state into an existing layer: everything the tools
would otherwise decide with `if framework == ...`. Each framework package declares one as
`MODEL`; the registry finds it by the framework that owns a model (`AdapterRegistry.model_adapter_of`).

The abstract methods are what every framework provides. The others have a default: a refusal
(UnsupportedObjectError naming what is expected instead) where only some frameworks can do it,
or nothing to do.
"""

from __future__ import annotations

import abc
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np

from schemas import InputFileError, LayerReport, NormbridgeError, NormSpec, UnsupportedObjectError

from .model_contents import ModelContents
from .model_structure import StructureParts
from .model_values import InputSpec, LayerFacts, LayerMoments, ModelRunner, Movement, NormLayerRef


class ModelAdapter(abc.ABC):
    """Whole models of one framework."""

    framework: ClassVar[str]
    #: LayerFacts.origin of layers found by walking the model (layer_facts' default).
    walk_origin: ClassVar[str] = ""
    #: Added to a layer-count mismatch when porting from this framework (what its models offer as layers).
    port_source_note: ClassVar[str] = ""
    #: Its models can be exported for serving and be the source side of the contract.
    serving_source: ClassVar[bool] = False
    #: How the train_mode hazard says a layer of this framework is in train mode, and how to fix it.
    train_mode_wording: ClassVar[tuple[str, str]] = (
        "is in train mode (module.training is True)",
        "call model.eval() before exporting or serving",
    )
    #: Its eps attributes are stored as float32 (ONNX), so an eps equals the default when their float32 values do.
    eps_stored_as_float32: ClassVar[bool] = False

    def own_eps_default(self, facts: LayerFacts) -> bool:
        """Whether the layer's class sets its own default eps (a hand-written class),
        so the stock default does not apply."""
        return False

    # -- files -----------------------------------------------------------------------------

    @abc.abstractmethod
    def load(self, path: Path) -> Any:
        """The model in `path` (a file with one of this framework's MODEL_FILES suffixes),
        without executing code from it."""

    def prepare_loading(self) -> None:
        """Import now what `load` imports on its first call (a warm worker does it between registrations).
        Default: nothing."""

    def load_bytes(self, data: bytes, name: str) -> Any:
        """The model in the file bytes `data` (`name`, e.g. 'model.pt2', for its suffix and messages),
        read as `load` reads a file.

        By default through a temporary file; frameworks that read from memory override it."""
        with tempfile.TemporaryDirectory(prefix="normbridge-model-") as folder:
            path = Path(folder) / name
            path.write_bytes(data)
            return self.load(path)

    @abc.abstractmethod
    def save(self, model: Any, path: Path) -> None:
        """Write `model` to `path` atomically, in the format it was loaded from."""

    # -- layers ----------------------------------------------------------------------------

    @abc.abstractmethod
    def norm_layers(self, model: Any) -> list[NormLayerRef]:
        """Every normalization layer object of `model`, in definition order."""

    @abc.abstractmethod
    def layer_specs(self, model: Any, sample: Any = None) -> list[NormSpec]:
        """The spec of every normalization layer, named by its path, in order
        (execution order where `sample` lets it trace one)."""

    def layer_spec(self, ref: NormLayerRef) -> NormSpec:
        """The spec of one layer `norm_layers` found, named by its path: `converters.api.layer_spec(ref)` reads it.

        Not done here because the adapter registry (which reading goes through) imports this module.
        """
        raise UnsupportedObjectError(
            f"the {self.framework} model adapter reads no layer specs; define layer_spec (converters.api.layer_spec)."
        )

    def unused_layers(self, model: Any, sample: Any = None) -> frozenset[str]:
        """The paths of the normalization layers whose output reaches no output of `model` (dead code, which an exporter
        drops); by default none is known to be."""
        return frozenset()

    def layer_facts(self, model: Any) -> list[LayerFacts]:
        """What inspection reports per layer: by default every walked layer, read through its adapter (`layer_spec`)."""
        facts = []
        for ref in self.norm_layers(model):
            spec, problem = None, None
            try:
                spec = self.layer_spec(ref)
            except NormbridgeError as error:
                problem = str(error)
            facts.append(
                LayerFacts(
                    path=ref.path,
                    kind=ref.kind,
                    framework=ref.framework,
                    origin=self.walk_origin or self.framework,
                    layer_type=type(ref.obj).__name__,
                    spec=spec,
                    training=ref.training,
                    problem=problem,
                )
            )
        return facts

    def model_hazards(self, model: Any, found: int | None = None) -> list:
        """Hazards of the model as a whole (schemas.inspection.Hazard); none by default. `found`: how many normalization
        layers the caller's reading of this model found (None: the adapter counts them where a hazard needs the
        count)."""
        return []

    def inspection_source(self, model: Any) -> str:
        """How inspection names the model when the caller gives no source."""
        return f"{self.framework} {type(model).__name__} '{getattr(model, 'name', '') or type(model).__name__}'"

    @abc.abstractmethod
    def describe(self, model: Any) -> str:
        """A short name for the model in reports (drift, recalibration, export)."""

    def artifact_contents(self, model: Any) -> ModelContents:
        """Every tensor of `model` and, per normalization layer, its spec and the tensors holding it (what the registry
        stores); refused unless the framework provides it."""
        raise UnsupportedObjectError(
            f"{self.framework} models cannot be registered yet; register a PyTorch, Keras or ONNX model."
        )

    def structure_of(
        self, model: Any, tensors: dict[str, np.ndarray], source: Path | None = None
    ) -> StructureParts | None:
        """The model's structure without its tensor bytes (model_structure.py), `tensors` being artifact_contents' by
        name and `source` the file it was loaded from; None when there is none to store
        (a torch nn.Module is its state dict)."""
        return None

    def model_file(self, parts: dict[str, bytes], tensors: Mapping[str, np.ndarray]) -> bytes:
        """The runnable model file of a stored structure with its tensors put back
        (the bytes of a file `load` reads)."""
        raise UnsupportedObjectError(
            f"{self.framework} models have no stored structure to rebuild; pull the state dict (--format safetensors)."
        )

    def write_model_file(self, parts: dict[str, bytes], tensors: Mapping[str, np.ndarray], stream: BinaryIO) -> None:
        """Write `model_file`'s bytes to `stream` (a pulled file's temporary sibling); frameworks that can write the
        file as they go, each tensor read once when its turn comes, override it."""
        stream.write(self.model_file(parts, tensors))

    def tensor_order(self, parts: dict[str, bytes], tensor_names: Iterable[str]) -> list[str]:
        """The tensors in the order `write_model_file` reads them, so a registry can fetch them ahead in that order
        (empty: no order, all are read before writing starts)."""
        return []

    # -- folder structures (a model given back as a folder of files: FrameworkInfo.folder_formats) --------------------

    def folder_tensor_order(self, parts: dict[str, bytes]) -> list[str]:
        """The tensors in the order `write_model_folder` reads them."""
        raise UnsupportedObjectError(f"{self.framework} models have no folder structure.")

    def write_model_folder(self, parts: dict[str, bytes], tensors: Mapping[str, np.ndarray], target: Path) -> int:
        """Write the folder of a stored folder structure into the empty folder `target`, every file fsynced;
        the bytes written."""
        raise UnsupportedObjectError(f"{self.framework} models have no folder structure.")

    def check_model_folder(self, parts: dict[str, bytes], tensors: Mapping[str, tuple[str, list[int]]]) -> None:
        """InputFileError unless `parts` (from a bundle: hostile) write the folder they claim; `tensors`: the manifest's
        (dtype, shape) by name."""
        raise UnsupportedObjectError(f"{self.framework} models have no folder structure.")

    def load_runnable(self, path: Path) -> Any:
        """The model of a folder `load` reads only for inspection (a Hugging Face checkpoint), with its weights and in
        the form the runners and exporters take (a program); refused unless the framework reads such folders."""
        raise UnsupportedObjectError(f"{self.framework} reads no model folders to run or export.")

    def runnable(self, model: Any) -> Any:
        """`model` in the form the runners and exporters take (a transformers model as a torch.export program); most
        models already are."""
        return model

    def load_model_folder(self, path: Path) -> Any:
        """The framework's object for a folder `write_model_folder` wrote (what `Registry.load` returns)."""
        raise UnsupportedObjectError(f"{self.framework} models have no folder structure.")

    # -- porting into an existing model ------------------------------------------------------

    def port_targets(self, model: Any) -> list[NormLayerRef]:
        """The layers a port writes into; refused unless the framework's models can be changed in place."""
        raise UnsupportedObjectError(
            f"the target is a {self.framework} model, expected a torch.nn.Module or a keras.Model; port into one of those and export it afterwards."
        )

    def plan_port_write(self, fresh: Any, target: Any, path: str, report: LayerReport) -> Any:
        """Check that `target` can hold `fresh`'s state; the planned writes (`.steps`), nothing written yet."""
        raise UnsupportedObjectError(f"layers of a {self.framework} model cannot be written in place.", layer=path)

    def snapshot(self, layer: Any) -> Callable[[], None]:
        """A function that puts `layer` back as it is now (run when a port fails midway)."""
        raise UnsupportedObjectError(f"layers of a {self.framework} model cannot be written in place.")

    def after_port(self, model: Any) -> None:
        """Anything the model needs once its layers were written (nothing by default)."""

    # -- running and serving -----------------------------------------------------------------

    @abc.abstractmethod
    def input_specs(self, model: Any) -> list[InputSpec]:
        """The model's inputs; UnsupportedObjectError when the model does not record them (pass a sample)."""

    def source_runner(self, model: Any) -> ModelRunner:
        """The model in eval mode, as the source side of the serving contract
        (models of a `serving_source` framework)."""
        raise InputFileError(
            f"the source must be a torch.nn.Module, a torch ExportedProgram (.pt2) or a Keras model (.keras); got a {type(model).__name__}."
        )

    def serving_runner(self, model: Any, optimized: bool = False) -> ModelRunner:
        """The model as the serving side of the contract: only ONNX graphs are served."""
        raise InputFileError(f"the serving model must be an ONNX model (.onnx); got a {type(model).__name__}.")

    def export_onnx(self, model: Any, sample: Any, opset: int) -> tuple[Any, str, list[str]]:
        """(onnx.ModelProto, the exporter as named in reports, notes) from the framework's own exporter
        (a `serving_source` framework)."""
        raise UnsupportedObjectError(
            f"{self.framework} models are not exported for serving; export the torch or Keras model they came from."
        )

    def unfold_exported(self, exported: Any, model: Any, specs: list[NormSpec]) -> tuple[Any, list[str]]:
        """Undo what the exporter folded away, using the source model; (graph, notes). Nothing by default."""
        return exported, []

    # -- BatchNorm statistics ------------------------------------------------------------------

    @abc.abstractmethod
    def batchnorm_moments(
        self, model: Any, batches: Iterable[Sequence[np.ndarray]], train: bool = False
    ) -> list[LayerMoments]:
        """The input moments of every BatchNorm with running statistics, in execution order.

        With `train`, each BatchNorm normalizes with its batch statistics while they are read
        (what a recalibration pass computes).
        """

    @abc.abstractmethod
    def recalibrate(
        self, model: Any, batches: list[tuple[np.ndarray, ...]], variance_estimator: str
    ) -> tuple[Any, list[Movement], str]:
        """(new model, how each BatchNorm's statistics moved, the method in one sentence); `model` is left as it was."""

    # -- serving -------------------------------------------------------------------------------

    def serving_taps(self, model: Any, sink: Any) -> Any:
        """`model` instrumented for the serving collector (converters.serving_taps.ServingTaps);
        refused unless the framework provides it."""
        raise UnsupportedObjectError(
            f"{self.framework} models cannot be monitored while serving; monitor a torch, Keras or onnxruntime model."
        )
