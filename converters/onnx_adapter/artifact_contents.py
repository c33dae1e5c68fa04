"""The contents of an ONNX graph for an artifact: its initializers, and per normalization site the node inputs holding
its state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onnx import numpy_helper

from schemas import SpecError
from schemas.kinds import ONNX_INPUTS  # ONNX op type -> spec tensor name per input position
from schemas.layer_errors import layer_error, read_layer

from ..model_contents import ModelContents, ModelNormalizer, ModelTensor
from .files import _check  # the package's own structural check (the one load_onnx runs)
from .graph.sites import find_norm_sites


def onnx_contents(model: Any) -> ModelContents:
    """Every initializer, and every normalization site (native or decomposed); a site whose state cannot be read refuses
    the model: it would pass the gate unchecked."""
    _check(model, Path("<in-memory onnx.ModelProto>"))  # files were checked on load; objects are checked here
    sites = read_layer(lambda: find_norm_sites(model), None)
    for site in sites:
        if site.spec is None:
            raise layer_error(
                site.problem or SpecError("its state cannot be read, so it cannot be checked."), site.name
            )
    by_name = {node.name or node.output[0]: node for node in model.graph.node}
    owner: dict[str, str] = {}  # initializer -> the (last) site whose native node reads it
    normalizers = []
    for site in sites:
        candidates: dict[str, str] = {}
        if site.native:
            node = by_name.get(site.node_names[0])
            positions = ONNX_INPUTS.get(node.op_type, {}) if node is not None else {}
            for index, spec_name in positions.items():
                if node is not None and index < len(node.input) and node.input[index]:
                    candidates[spec_name] = node.input[index]
        owner.update({name: site.name for name in candidates.values()})
        spec = (
            site.spec
            if site.spec.name == site.name
            else read_layer(lambda site=site: site.spec.replace(name=site.name), site.name)
        )
        normalizers.append(ModelNormalizer(site.name, spec, candidates))
    tensors = [ModelTensor(i.name, numpy_helper.to_array(i), owner.get(i.name)) for i in model.graph.initializer]
    return ModelContents("onnx", "onnx", tensors, normalizers, sites=len(sites))


__all__ = ["onnx_contents"]
