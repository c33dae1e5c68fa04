"""Extracting an artifact from a model: its manifest, one blob per tensor, and its normalizer specs.

Every tensor of the model (torch state_dict keys, Keras variable paths, ONNX initializer names)
becomes its own blob: a single-tensor safetensors file with the key "tensor". The bytes depend
only on the tensor, so equal tensors share one blob across versions and models, and a fine-tune
that moved only the running statistics adds only the statistics' blobs. Each normalizer's spec
tensors point to the model tensor that holds the same bytes; a spec tensor the model does not
hold (Keras and ONNX keep no num_batches_tracked) is stored as an extra tensor '<path>::<name>'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np
from schemas import NormSpec
from schemas.atomic_io import atomic_write_folder
from schemas.errors import InputFileError, NormbridgeError, SpecError, UnsupportedObjectError
from schemas.kinds import ONNX_INPUTS  # ONNX op type -> spec tensor name per input position
from schemas.manifest import ArtifactManifest, Lineage, NormalizerEntry, TensorRef, load_manifest, sha256_hex
from schemas.tensors import STORED_DTYPES, tensors_identical

from .tensor_blobs import SAFETENSORS_DTYPES, check_tensor_header, tensor_blob, tensor_from_blob  # noqa: F401 - re-exported

MANIFEST_FILE = "manifest.json"
BLOBS_DIR = "blobs"
#: The last member of a bundle download the server had to stop (a stored blob failed its hash): why, as error JSON.
BUNDLE_ERROR_FILE = "normbridge-error.json"

#: Spec tensor name -> the short names a framework gives the tensor holding it.
NAME_HINTS: dict[str, tuple[str, ...]] = {
    "scale": ("weight", "gamma", "scale"),
    "bias": ("bias", "beta"),
    "running_mean": ("running_mean", "moving_mean"),
    "running_var": ("running_var", "moving_variance"),
    "num_batches_tracked": ("num_batches_tracked",),
}


@dataclass
class Artifact:
    """A manifest, the blobs it references (digest -> bytes) and the normalizer specs.

    `sites` is how many normalization layers the model holds, as its reader found them (None for a saved artifact
    folder, whose manifest is all there is): the registry's gate refuses a registration that checks fewer.
    """

    manifest: ArtifactManifest
    blobs: dict[str, bytes] = field(default_factory=dict)
    specs: list[NormSpec] = field(default_factory=list)
    sites: int | None = None


# -- reading blobs ----------------------------------------------------------------------------


def tensors_from_blobs(manifest: ArtifactManifest, get: Callable[[str], bytes]) -> dict[str, np.ndarray]:
    """Every manifest tensor by name, read through `get(digest)`."""
    return {name: tensor_from_blob(get(ref.digest), ref, name) for name, ref in manifest.tensors.items()}


def specs_from_manifest(manifest: ArtifactManifest, get: Callable[[str], bytes]) -> list[NormSpec]:
    """Every normalizer's NormSpec rebuilt from its configuration and blobs (validated: NaN statistics are refused)."""
    specs = []
    for entry in manifest.normalizers:
        tensors = {}
        for spec_name, tensor_name in entry.tensors.items():
            ref = manifest.tensors[tensor_name]
            tensors[spec_name] = tensor_from_blob(get(ref.digest), ref, tensor_name)
        specs.append(_spec(entry.path, entry.spec, tensors))
    return specs


def _spec(path: str, config: dict, tensors: dict[str, np.ndarray]) -> NormSpec:
    try:
        return NormSpec(**config, tensors=tensors)
    except SpecError as error:
        raise _named(error, path) from error
    except Exception as error:  # pydantic ValidationError
        raise SpecError(f"the normalizer's spec does not match the schema ({error}).", layer=path) from error


def _named(error: NormbridgeError, path: str) -> SpecError:
    """The error as a SpecError that names the layer by its path in the model (and keeps the setting)."""
    if error.layer == path and isinstance(error, SpecError):
        return error
    message = error.message
    if error.layer is not None:  # drop the reader's own layer prefix (a class name, not the model path)
        prefix = f"layer '{error.layer}', setting '{error.setting}': " if error.setting is not None else f"layer '{error.layer}': "
        message = message.removeprefix(prefix)
    return SpecError(message, layer=path, setting=error.setting)


# -- extraction -------------------------------------------------------------------------------


class _Builder:
    """Collects tensors and normalizers into a manifest and its blobs."""

    def __init__(self, framework: str, fmt: str):
        self.framework, self.format = framework, fmt
        self.arrays: dict[str, np.ndarray] = {}
        self.layers: dict[str, str | None] = {}
        self.roles: dict[str, str] = {}
        self.entries: list[NormalizerEntry] = []
        self.specs: list[NormSpec] = []
        self.sites = 0  # normalization layers found in the model (each must become an entry)

    def add_tensor(self, name: str, array: np.ndarray, layer: str | None = None) -> None:
        if str(array.dtype) not in STORED_DTYPES:
            raise InputFileError(f"tensor '{name}' has dtype {array.dtype}, which an artifact cannot store; "
                                 f"convert it to one of {', '.join(STORED_DTYPES)}.")
        self.arrays[name] = np.array(array, order="C", copy=True)  # a copy: torch's .numpy() shares the module's memory
        self.layers[name] = layer

    def add_normalizer(self, path: str, spec: NormSpec, candidates: dict[str, str]) -> None:
        """Point each spec tensor to the candidate tensor (spec name -> model tensor name) holding its bytes."""
        mapping: dict[str, str] = {}
        for spec_name, array in sorted(spec.tensors.items()):
            target = candidates.get(spec_name)
            if target is None or target not in self.arrays or not tensors_identical(self.arrays[target], array) or target in self.roles:
                target = f"{path}::{spec_name}"
                self.add_tensor(target, np.asarray(array))
            self.roles[target] = spec_name
            self.layers[target] = path
            mapping[spec_name] = target
        self.entries.append(NormalizerEntry(path=path, spec=spec.config_dict(), tensors=mapping))
        self.specs.append(spec)

    def build(self, mode: str, lineage: Lineage | None) -> Artifact:
        blobs: dict[str, bytes] = {}
        refs: dict[str, TensorRef] = {}
        for name in sorted(self.arrays):
            array = self.arrays[name]
            data = tensor_blob(array)
            digest = sha256_hex(data)
            blobs[digest] = data
            refs[name] = TensorRef(
                digest=digest, dtype=str(array.dtype), shape=list(array.shape), nbytes=int(array.nbytes),
                role=self.roles.get(name, "weight"), layer=self.layers.get(name),
            )
        manifest = ArtifactManifest(
            framework=self.framework, format=self.format, mode=mode, tensors=refs,
            normalizers=self.entries, lineage=lineage or Lineage(),
        )
        return Artifact(manifest=manifest, blobs=blobs, specs=self.specs, sites=self.sites)


def _mode_of(specs: list[NormSpec]) -> str:
    if not specs:
        return "n/a"
    flags = {spec.training for spec in specs}
    return "mixed" if len(flags) == 2 else ("train" if flags == {True} else "eval")


def _hinted(prefix: str, names: list[str], separator: str) -> dict[str, str]:
    """Spec tensor name -> the tensor among `names` under `prefix` whose short name is a hint for it."""
    found: dict[str, str] = {}
    for name in names:
        if prefix and not name.startswith(prefix + separator):
            continue
        short = name[len(prefix) + 1 :] if prefix else name
        for spec_name, hints in NAME_HINTS.items():
            if short in hints and spec_name not in found:
                found[spec_name] = name
    return found


def _torch_array(tensor: Any, name: str) -> np.ndarray:
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        # NumPy holds bfloat16 through ml_dtypes; torch's .numpy() cannot make one, so the bits go through int16.
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return tensor.numpy()


def _from_torch_module(module: Any) -> _Builder:
    from converters.models.walking import norm_layers, spec_of

    builder = _Builder("torch", "torch-module")
    refs = norm_layers(module)
    _refuse_unread_torch_layers(module, refs)
    builder.sites = len(refs)
    specs = [(ref, _read(lambda ref=ref: spec_of(ref), ref.path)) for ref in refs]
    for name, tensor in module.state_dict(keep_vars=False).items():
        builder.add_tensor(name, _torch_array(tensor, name), layer=name.rpartition(".")[0] or None)
    names = list(builder.arrays)
    for ref, spec in specs:
        prefix = "" if ref.obj is module else ref.path  # a bare layer: its state_dict keys have no prefix
        builder.add_normalizer(ref.path, spec, _hinted(prefix, names, "."))
    return builder


def _refuse_unread_torch_layers(module: Any, refs: list) -> None:
    """A normalization module the walker passed over (SyncBatchNorm, a lazy or custom BatchNorm) refuses the model, naming
    it and why: registered, it would pass the gate unchecked."""
    import torch

    from converters.adapters import REGISTRY

    read = {id(ref.obj) for ref in refs}
    norms = (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.RMSNorm)
    for path, sub in module.named_modules():
        if isinstance(sub, norms) and id(sub) not in read:
            try:
                REGISTRY.framework("torch").kind_of(sub)
                reason = f"normbridge did not read this {type(sub).__name__}"
            except NormbridgeError as error:
                reason = error.message
            raise UnsupportedObjectError(f"{reason.rstrip('.')}; a model is registered only when each of its normalization layers is checked.",
                                         layer=path or type(sub).__name__)


def _from_exported(program: Any) -> _Builder:
    from converters.torch_adapter.exported_program import exported_specs

    builder = _Builder("torch", "pt2")
    specs = _read(lambda: exported_specs(program), None)  # refuses a layer it cannot read, naming it
    builder.sites = len(specs)
    state = dict(program.state_dict)
    state.update({name: value for name, value in program.constants.items() if hasattr(value, "detach")})
    for name, tensor in state.items():
        builder.add_tensor(name, _torch_array(tensor, name), layer=name.rpartition(".")[0] or None)
    names = list(builder.arrays)
    for spec in specs:
        builder.add_normalizer(spec.name, spec, _hinted(spec.name, names, "."))
    return builder


def _from_keras(model: Any) -> _Builder:
    from converters.models.walking import norm_layers, spec_of

    builder = _Builder("keras", "keras")
    refs = norm_layers(model)
    builder.sites = len(refs)
    specs = [(ref, _read(lambda ref=ref: spec_of(ref), ref.path)) for ref in refs]
    # variable.path starts with the model's name in memory ('sequential/dense/kernel') but not after
    # loading a .keras file ('dense/kernel'): drop it so the same model has the same tensor names.
    top = f"{model.name}/"

    def name_of(variable: Any) -> str:
        return variable.path[len(top) :] if variable.path.startswith(top) else variable.path

    for variable in model.weights:
        name = name_of(variable)
        builder.add_tensor(name, np.asarray(variable.numpy()), layer=name.rpartition("/")[0] or None)
    for ref, spec in specs:
        layer_vars = [name_of(v) for v in ref.obj.weights]
        prefix = layer_vars[0].rpartition("/")[0] if layer_vars else ref.path
        builder.add_normalizer(ref.path, spec, _hinted(prefix, layer_vars, "/"))
    return builder


def _from_onnx(model: Any) -> _Builder:
    from onnx import numpy_helper

    from converters.onnx_adapter.graph.sites import find_norm_sites
    from converters.onnx_adapter.files import _check

    _check(model, Path("<in-memory onnx.ModelProto>"))  # files were checked on load; objects are checked here
    builder = _Builder("onnx", "onnx")
    sites = _read(lambda: find_norm_sites(model), None)
    builder.sites = len(sites)
    for site in sites:  # a layer that cannot be checked refuses the model: it would pass the gate unchecked
        if site.spec is None:
            raise _named(site.problem or SpecError("its state cannot be read, so it cannot be checked."), site.name)
    for initializer in model.graph.initializer:
        builder.add_tensor(initializer.name, numpy_helper.to_array(initializer))
    by_name = {node.name or node.output[0]: node for node in model.graph.node}
    for site in sites:
        candidates: dict[str, str] = {}
        if site.native:
            node = by_name.get(site.node_names[0])
            positions = ONNX_INPUTS.get(node.op_type, {}) if node is not None else {}
            for index, spec_name in positions.items():
                if node is not None and index < len(node.input) and node.input[index]:
                    candidates[spec_name] = node.input[index]
        for name in candidates.values():
            builder.layers[name] = site.name
        spec = site.spec if site.spec.name == site.name else _read(lambda site=site: site.spec.replace(name=site.name), site.name)
        builder.add_normalizer(site.name, spec, candidates)
    return builder


def _read(read: Callable[[], Any], path: str | None) -> Any:
    """Run a spec reader; its errors name the layer by its path in the model."""
    try:
        return read()
    except NormbridgeError as error:
        if path is None or error.layer == path:
            raise
        raise _named(error, path) from error


def extract_artifact(model: Any, lineage: Lineage | None = None) -> Artifact:
    """The artifact of a torch nn.Module, ExportedProgram, keras.Model, onnx.ModelProto, or a path.

    Paths: .pt2, .keras (safe_mode), .onnx through converters.models.loading.load_model, or a
    saved artifact folder (its content is kept; its lineage becomes `lineage`, by default 'imported').
    Refused before anything is produced: pickles, unreadable files, invalid specs (NaN statistics
    name their layer).
    """
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.is_dir() and (path / MANIFEST_FILE).exists():
            artifact = load_artifact_folder(path)
            artifact.manifest = artifact.manifest.model_copy(update={"lineage": lineage or Lineage(operation="imported")})
            return artifact
        from converters.models.loading import load_model

        model = load_model(path)
    builder = _builder_for(model)
    mode = "n/a" if builder.framework == "keras" else _mode_of(builder.specs)
    return builder.build(mode, lineage)


def _builder_for(model: Any) -> _Builder:
    from converters.torch_adapter.exported_program import is_exported_program
    from converters.models.loading import framework_of_model

    if isinstance(model, NormSpec):
        raise InputFileError("got a single-layer spec folder; register a whole model (.pt2, .keras, .onnx, a torch module or an artifact folder).")
    if is_exported_program(model):
        return _from_exported(model)
    framework = framework_of_model(model)
    if framework == "torch":
        return _from_torch_module(model)
    if framework == "keras":
        return _from_keras(model)
    return _from_onnx(model)


# -- folders ----------------------------------------------------------------------------------


def save_artifact_folder(artifact: Artifact, folder: str | Path) -> Path:
    """Write manifest.json and blobs/<digest>.safetensors into `folder`, atomically."""

    def fill(target: Path) -> None:
        (target / BLOBS_DIR).mkdir(parents=True, exist_ok=True)
        for digest in artifact.manifest.blob_digests():
            (target / BLOBS_DIR / f"{digest}.safetensors").write_bytes(artifact.blobs[digest])
        (target / MANIFEST_FILE).write_text(artifact.manifest.to_json() + "\n")

    return atomic_write_folder(folder, fill)


def load_artifact_folder(folder: str | Path) -> Artifact:
    """The artifact saved in `folder`; every blob is re-hashed and every spec re-validated first."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        raise InputFileError(f"'{folder}' holds no {MANIFEST_FILE}; pass a folder written by save_artifact_folder.")
    try:
        document = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputFileError(f"'{manifest_path}' is not valid JSON ({error}); re-export the artifact.") from error
    manifest = load_manifest(document)
    blobs: dict[str, bytes] = {}
    for digest in manifest.blob_digests():
        path = folder / BLOBS_DIR / f"{digest}.safetensors"
        if not path.is_file():
            raise InputFileError(f"blob '{path.name}' listed in the manifest is missing from '{folder / BLOBS_DIR}'; re-export the artifact.")
        data = path.read_bytes()
        if sha256_hex(data) != digest:
            raise InputFileError(f"blob '{path}' does not hash to its name (sha256 {sha256_hex(data)[:12]}...): it was corrupted or modified; re-export the artifact.")
        blobs[digest] = data
    tensors_from_blobs(manifest, blobs.__getitem__)  # every blob must be the tensor the manifest says
    specs = specs_from_manifest(manifest, blobs.__getitem__)
    return Artifact(manifest=manifest, blobs=blobs, specs=specs)
