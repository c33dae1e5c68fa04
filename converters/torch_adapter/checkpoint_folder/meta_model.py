"""The model a checkpoint folder's config.json names, built without allocating its weights; its norms read from files.

The architecture comes from transformers' own configuration and model classes: `config.json` is read as JSON (bounded),
refused if it asks for remote code (`auto_map` anywhere in it) or names a `model_type` transformers does not ship, and
turned into the configuration class transformers registers for that type; the model class is the one its
`architectures` names among transformers' own (else `AutoModel`'s). It is built on the meta device, so a config that
claims a billion-wide hidden size allocates nothing, and every tensor it declares is compared by shape with the one
the files hold before anything is read. Then only the normalization modules (the stock classes, and the modules the
torch recognizers take as candidates: hand-written RMSNorms, q/k norms, Gemma's 1+w, frozen BatchNorms) get their
tensors, each read from its byte range; everything else stays on the meta device. The result is a live
`torch.nn.Module` the torch model adapter walks and the recognizers prove, as for a model built in Python.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
import weakref
from pathlib import Path
from typing import Any

import torch

from schemas import InputFileError
from schemas.extras import missing_dependency

from ..recognition.computed import STOCK, why_candidate
from .folder_checks import CheckedFolder, check_folder
from .safetensors_index import TensorEntry, checked_tensors, read_tensor

_LOG = logging.getLogger(__name__)
#: model -> its files' tensors under the model's names, for the registry (`tensors_of`).
_TENSORS: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, TensorEntry]]" = weakref.WeakKeyDictionary()
#: model -> the folder it was read from, for its structure (`folder_of`).
_FOLDERS: "weakref.WeakKeyDictionary[torch.nn.Module, CheckedFolder]" = weakref.WeakKeyDictionary()
#: A config.json is kilobytes; a bound keeps a hostile one from being read whole.
MAX_CONFIG_BYTES = 16 * 1024 * 1024


def load_checkpoint_folder(path: str | Path) -> torch.nn.Module:
    """The model of a Hugging Face checkpoint folder, in eval mode, with its normalization modules' tensors loaded."""
    folder = check_folder(Path(path))
    config = _read_config(folder.config)
    tensors = checked_tensors(folder)
    model = _meta_model(folder.config, config)
    named = _matching_names(folder.config, model, tensors)
    _check_shapes(folder.config, model, named)
    _load_norms(model, named)
    _TENSORS[model] = named
    _FOLDERS[model] = folder
    return model.eval()


def folder_of(model: torch.nn.Module) -> CheckedFolder | None:
    """The checked folder a model `load_checkpoint_folder` returned was read from; None for another model."""
    return _FOLDERS.get(model)


def load_pretrained(path: str | Path, *, complete: bool = False) -> torch.nn.Module:
    """The model of a checkpoint folder with all its weights, through transformers' own `from_pretrained` (after the
    folder's and the config's checks: no pickle, no remote code), in eval mode: what `Registry.load` gives back. With
    `complete`, refused when the model has tensors the folder lacks (transformers initializes them at random: a served
    file must not hold those)."""
    folder = check_folder(Path(path))
    data = _read_config(folder.config)
    config, model_class = _config_and_class(folder.config, data)
    transformers = _transformers()
    model_class = model_class or transformers.AutoModel
    try:
        with _quiet_loading(transformers):
            model, info = model_class.from_pretrained(
                folder.root, config=config, trust_remote_code=False, output_loading_info=True
            )
    except Exception as error:  # noqa: BLE001 - what transformers raises on files it cannot load: the folder's fault
        raise InputFileError(
            f"transformers could not load '{folder.root}' as {model_class.__name__} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})."
        ) from None
    missing = sorted(info.get("missing_keys") or ())
    if complete and missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise InputFileError(
            f"the {model_class.__name__} that '{folder.config}' names has {len(missing)} tensors '{folder.root}' does not "
            f"hold ({shown}), which transformers would initialize at random; save the model you serve with "
            "`save_pretrained`, or set `architectures` in config.json to the class that was saved."
        )
    return model.eval()


@contextmanager
def _quiet_loading(transformers: Any):
    """transformers' loading bar and load report off while a folder loads (normbridge says what it found),
    then as they were."""
    logging_ = transformers.utils.logging
    verbosity, bar = logging_.get_verbosity(), logging_.is_progress_bar_enabled()
    logging_.set_verbosity_error()
    logging_.disable_progress_bar()
    try:
        yield
    finally:
        logging_.set_verbosity(verbosity)
        if bar:
            logging_.enable_progress_bar()


def tensors_of(model: torch.nn.Module) -> dict[str, TensorEntry] | None:
    """The files' tensors of a model `load_checkpoint_folder` returned, under the model's names; None for another."""
    return _TENSORS.get(model)


def _read_config(config: Path) -> dict:
    if config.stat().st_size > MAX_CONFIG_BYTES:
        raise InputFileError(
            f"'{config}' is larger than {MAX_CONFIG_BYTES} bytes, far more than a model's config; check the file."
        )
    try:
        data = json.loads(config.read_bytes())
        if not isinstance(data, dict):
            raise InputFileError(f"'{config}' is not a JSON object; save the checkpoint again with `save_pretrained`.")
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputFileError(
            f"'{config}' is not JSON ({error}); save the checkpoint again with `save_pretrained`."
        ) from None
    except RecursionError:
        raise InputFileError(f"'{config}' nests deeper than any model's config; save the checkpoint again.") from None
    refuse_code_in_config(config, data)
    return data


def refuse_code_in_config(config: Path | str, data: dict) -> None:
    """InputFileError when the config asks for code normbridge never runs: remote code (`auto_map`) or a timm model."""
    try:
        timm, where = _through_timm(data), _auto_map(data)
    except RecursionError:
        raise InputFileError(f"'{config}' nests deeper than any model's config; save the checkpoint again.") from None
    if timm is not None:
        raise InputFileError(
            f"'{config}' builds its model through timm ({timm}), whose options can load files (checkpoint_path), so "
            "normbridge does not build it; export the model with torch.export (.pt2)."
        )
    if where is not None:
        raise InputFileError(
            f"'{config}' has 'auto_map' ({where}), so its model is code shipped beside it (trust_remote_code), which "
            "normbridge never runs; save the model as an architecture transformers ships, or export it with "
            "torch.export (.pt2)."
        )


def _auto_map(value: Any, where: str = "config") -> str | None:
    """Where an 'auto_map' key sits in the config (sub-configs too), or None."""
    if isinstance(value, dict):
        if "auto_map" in value:
            return f"{where}.auto_map"
        return next((found for key, item in value.items() if (found := _auto_map(item, f"{where}.{key}"))), None)
    if isinstance(value, list):
        return next((found for i, item in enumerate(value) if (found := _auto_map(item, f"{where}[{i}]"))), None)
    return None


#: Configurations whose model transformers hands to timm: timm.create_model takes their options as keyword arguments.
_TIMM_MODEL_TYPES = ("timm_wrapper", "timm_backbone")


def _through_timm(value: Any, where: str = "config") -> str | None:
    """Where the config (or a sub-config) asks for a timm model, or None."""
    if isinstance(value, dict):
        if value.get("model_type") in _TIMM_MODEL_TYPES:
            return f"{where}.model_type {value['model_type']!r}"
        if value.get("use_timm_backbone") is True:
            return f"{where}.use_timm_backbone"
        return next((found for key, item in value.items() if (found := _through_timm(item, f"{where}.{key}"))), None)
    if isinstance(value, list):
        return next((found for i, item in enumerate(value) if (found := _through_timm(item, f"{where}[{i}]"))), None)
    return None


def _transformers() -> Any:
    try:
        import transformers
    except ModuleNotFoundError as error:
        raise missing_dependency(error, "reading a Hugging Face checkpoint folder") or error from None
    return transformers


def _config_and_class(config_path: Path, data: dict) -> tuple[Any, type | None]:
    """transformers' configuration of `data` and the model class its `architectures` names
    (None: AutoModel's choice)."""
    transformers = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise InputFileError(
            f"'{config_path}' names model_type {model_type!r}, which transformers {transformers.__version__} does "
            "not ship; "
            "upgrade transformers, or export the model with torch.export (.pt2)."
        )
    try:
        config = CONFIG_MAPPING[model_type].from_dict(data)
        return config, _model_class(transformers, config)
    except Exception as error:  # noqa: BLE001 - what transformers raises on a config it cannot build: the file's fault
        raise _not_buildable(config_path, model_type, error) from None


def _not_buildable(config_path: Path, model_type: str, error: Exception) -> InputFileError:
    return InputFileError(
        f"'{config_path}' does not describe a {model_type} model transformers can build ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else ''}); save the checkpoint again with `save_pretrained`."
    )


def _meta_model(config_path: Path, data: dict) -> torch.nn.Module:
    config, model_class = _config_and_class(config_path, data)
    try:
        with torch.device("meta"):
            return model_class(config) if model_class is not None else _transformers().AutoModel.from_config(config)
    except Exception as error:  # noqa: BLE001 - what transformers raises on a config it cannot build: the file's fault
        raise _not_buildable(config_path, data.get("model_type"), error) from None


def _model_class(transformers: Any, config: Any) -> type | None:
    """The class `architectures` names, when transformers ships it and it takes this config; None for AutoModel's
    choice."""
    names = getattr(config, "architectures", None) or []
    name = names[0] if names and isinstance(names[0], str) and names[0].isidentifier() else None
    found = getattr(transformers, name, None) if name is not None else None
    is_model = isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)
    if is_model and isinstance(config, found.config_class):
        return found
    return None


def _matching_names(
    config_path: Path, model: torch.nn.Module, tensors: dict[str, TensorEntry]
) -> dict[str, TensorEntry]:
    """The files' tensors under the model's names: as saved, as transformers renames them when it loads (DETR saves its
    backbone's tensors under `backbone.conv_encoder.`), or with the base model's prefix added or removed (a
    `LlamaForCausalLM` checkpoint read as a `LlamaModel`, and back), whichever names more of the model's tensors. A
    tensor no way renames keeps its saved name: every tensor of the files is in the result."""
    wanted = set(model.state_dict(keep_vars=True))
    prefix = getattr(model, "base_model_prefix", "") or ""
    ways = [tensors, *_renamed_by_transformers(model, tensors)]
    if prefix:
        ways.append({k.removeprefix(prefix + "."): v for k, v in tensors.items()})
        ways.append({f"{prefix}.{k}": v for k, v in tensors.items()})
    ways = [way for way in ways if len(way) == len(tensors)]  # a renaming that merged two names is not one to use
    best = max(ways, key=lambda way: len(wanted & way.keys()))
    if not wanted & best.keys():
        raise InputFileError(
            f"none of the tensors of the {type(model).__name__} that '{config_path}' describes is in the folder's "
            "safetensors files; pass the folder save_pretrained wrote for this model."
        )
    return best


def _renamed_by_transformers(model: torch.nn.Module, tensors: dict[str, TensorEntry]) -> list[dict[str, TensorEntry]]:
    """The names transformers' loader gives the files' keys (its checkpoint conversion mapping for this model), keeping
    the saved name of a tensor it would transform rather than rename (experts merged into one tensor: no byte range
    holds the result); none when this transformers has no such mapping (its loading internals change between
    releases)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = get_model_conversion_mapping(model)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        meta_state = model.state_dict(keep_vars=True)
        renamed = {}
        for key, entry in tensors.items():
            name, converted = rename_source_key(key, renamings, converters, model.base_model_prefix or None, meta_state)
            renamed[name if converted is None else key] = entry
        return [renamed]
    except Exception as error:  # noqa: BLE001 - the names as saved, and the prefix rule, remain
        _LOG.debug("transformers' checkpoint key renaming is not available here (%s: %s)", type(error).__name__, error)
        return []


def _check_shapes(config_path: Path, model: torch.nn.Module, named: dict[str, TensorEntry]) -> None:
    """Every tensor the config declares and the files hold has the same shape in both (an absurd config stops here)."""
    for name, tensor in model.state_dict(keep_vars=True).items():
        entry = named.get(name)
        if entry is not None and tuple(tensor.shape) != entry.shape:
            raise InputFileError(
                f"'{config_path}' makes tensor '{name}' of shape {tuple(tensor.shape)}, but '{entry.file}' holds it "
                f"with shape {entry.shape}; the config does not describe these weights: pass the config.json saved "
                "with them."
            )


def norm_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules a torch recognizer may read: stock normalization classes and `recognition.computed`'s candidates."""
    return [
        (path, module) for path, module in model.named_modules() if isinstance(module, STOCK) or why_candidate(module)
    ]


def _load_norms(model: torch.nn.Module, named: dict[str, TensorEntry]) -> None:
    for path, module in norm_modules(model):
        persistent = set(module.state_dict(keep_vars=True))
        for owner_path, owner in module.named_modules():
            for slot, table in (("_parameters", owner._parameters), ("_buffers", owner._buffers)):
                for name, tensor in list(table.items()):
                    if tensor is None or not tensor.is_meta:
                        continue
                    local = f"{owner_path}.{name}" if owner_path else name
                    key = f"{path}.{local}" if path else local
                    entry = named.get(key)
                    if entry is None:
                        if local in persistent:
                            raise InputFileError(
                                f"the checkpoint's safetensors files hold no '{key}', a tensor of normalization "
                                f"'{path}'; "
                                "pass the whole folder save_pretrained wrote."
                            )
                        continue  # a non-persistent buffer: the recognizers say what they cannot read without it
                    value = read_tensor(entry)
                    table[name] = torch.nn.Parameter(value, requires_grad=False) if slot == "_parameters" else value


__all__ = [
    "folder_of",
    "load_checkpoint_folder",
    "load_pretrained",
    "norm_modules",
    "refuse_code_in_config",
    "tensors_of",
]
