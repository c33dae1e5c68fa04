"""OnnxModelAdapter: ONNX graphs as whole models, read by the graph analysis
(onnx_adapter/graph/) and run in onnxruntime."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas import NormSpec, UnsupportedObjectError
from schemas.inspection import Hazard

from ..model_adapter import ModelAdapter
from ..model_values import LayerFacts, NormLayerRef
from . import recalibration, running, serving_taps, statistics
from .files import load_onnx, load_onnx_bytes, save_onnx
from .structure import onnx_file, onnx_structure


class OnnxModelAdapter(ModelAdapter):
    """Graphs have no layer objects: normalizations are sites (native nodes or decompositions),
    and graphs are what is served."""

    framework = "onnx"
    train_mode_wording = ("has training_mode=1", "export the model again from eval mode")
    eps_stored_as_float32 = True
    port_source_note = " (an ONNX source offers native normalization nodes only: a BatchNorm folded into a Conv or a decomposed norm is not a layer there)"

    def load(self, path: Path) -> Any:
        return load_onnx(path)

    def load_bytes(self, data: bytes, name: str) -> Any:
        return load_onnx_bytes(data, Path(name))

    def save(self, model: Any, path: Path) -> None:
        save_onnx(model, path)

    # -- layers ----------------------------------------------------------------------------

    def norm_layers(self, model: Any) -> list[NormLayerRef]:
        raise UnsupportedObjectError(
            f"norm_layers walks PyTorch and Keras models; got a {self.framework} model (use the ONNX graph tools)."
        )

    def layer_specs(self, model: Any, sample: Any = None) -> list[NormSpec]:
        """Each native normalization node, read as a one-node model (decompositions and folded BatchNorms are not layers
        here)."""
        from .node_reading import native_node_specs

        return native_node_specs(model)

    def layer_facts(self, model: Any) -> list[LayerFacts]:
        """Every normalization site of the graph, native or decomposed."""
        from .graph.sites import find_norm_sites

        facts = []
        for site in find_norm_sites(model):
            ops = tuple(site.op_types)
            distinct = tuple(dict.fromkeys(ops))
            layer_type = (
                "+".join(distinct) if len(distinct) <= 3 else f"{len(ops)} primitive ops"
            )  # the hazard lists them all
            facts.append(
                LayerFacts(
                    path=site.name,
                    kind=site.kind,
                    framework="onnx",
                    origin=site.origin,
                    layer_type=layer_type,
                    spec=site.spec,
                    training=bool(site.training_mode),
                    eps=site.eps,
                    native=site.native,
                    folded=site.folded,
                    op_types=ops,
                )
            )
        return facts

    def model_hazards(self, model: Any, found: int | None = None) -> list[Hazard]:
        """Conv nodes and no BatchNormalization left: any BatchNorm was folded into the Conv weights."""
        from .graph.sites import batchnorm_folded_into_conv

        if not batchnorm_folded_into_conv(model):
            return []
        return [
            Hazard(
                code="folded_batchnorm",
                severity="warning",
                message="the graph has Conv nodes and no BatchNormalization: any BatchNorm was folded into the Conv weights and bias "
                "(torch.onnx.export does this by default, tf2onnx always), so its statistics can no longer be checked or recalibrated; "
                "export with torch.onnx.export(..., optimize=False) (with dynamo=False: do_constant_folding=False) to keep the "
                "BatchNormalization nodes.",
            )
        ]

    def inspection_source(self, model: Any) -> str:
        return f"onnx graph '{model.graph.name}'"

    def describe(self, model: Any) -> str:
        return f"onnx '{model.graph.name or 'graph'}'"

    def artifact_contents(self, model: Any):
        from .artifact_contents import onnx_contents

        return onnx_contents(model)

    def structure_of(self, model: Any, tensors, source=None):
        return onnx_structure(model, tensors, read_safely=source is not None)

    def model_file(self, parts, tensors) -> bytes:
        return onnx_file(parts, tensors)

    # -- running and serving ---------------------------------------------------------------

    def input_specs(self, model: Any):
        return running.input_specs(model)

    def serving_runner(self, model: Any, optimized: bool = False):
        return running.serving_runner(model, optimized)

    # -- BatchNorm statistics --------------------------------------------------------------

    def batchnorm_moments(self, model: Any, batches, train: bool = False):
        return statistics.onnx_batchnorm_moments(model, batches, train)

    def recalibrate(self, model: Any, batches, variance_estimator: str):
        return recalibration.recalibrate_onnx(model, batches, variance_estimator)

    # -- serving -------------------------------------------------------------------------------

    def serving_taps(self, model: Any, sink):
        """An onnxruntime session (or a ModelProto) served through a MonitoredSession;
        the served graph's outputs are unchanged."""
        return serving_taps.session_taps(model, sink)
