"""A `.keras` archive checked before Keras reads it: its entries, what its weights declare, what its config builds.

`keras.saving.load_model` reads config.json whole, builds and initialises every variable the config declares, and only
then reads model.weights.h5, each dataset as large as its shape says. So a small file could cost gigabytes twice over
(issue 30, holes 4 and 5). Here, before Keras is called:

- every entry unpacks to at most MAX_DEFLATE_RATIO times its stored size (above MIN_BOMB_BYTES): model.save stores
  entries plainly, and Keras's own check starts at 4 GiB;
- the weights must be in model.weights.h5 (a `model.weights.npz`, Keras's other format, holds pickled object arrays
  Keras cannot load with allow_pickle=False, while a crafted numeric one is read whole and turned into Python lists);
  what its datasets declare is bounded by what it stores (`weights_file`);
- the variables the config builds, counted without allocating them (`built_variables`), may not exceed what the weights
  file declares by more than SLACK_BYTES (nor may the variables a layer reads while it is built): a genuine file stores
  every variable Keras builds for it, and Keras refuses a file whose weights do not fill them anyway, after having
  allocated them.

What passes builds at most SLACK_BYTES more than its weights file declares, which is at most MAX_DEFLATE_RATIO times
that file's size, and on a server at most its upload limit (`declared_weight_bytes`, registry/http/uploads.py).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from schemas import InputFileError

from .built_variables import VariablesOverBudget, built_variables
from .structure import CONFIG
from .entry_window import entry_file
from .weights_file import MAX_DEFLATE_RATIO, MIN_BOMB_BYTES, WEIGHTS, DeclaredWeights, declared_weights

NPZ_WEIGHTS = "model.weights.npz"
#: Bytes the variables a config builds may exceed what the weights file declares by (seed generator states and other
#: small state a layer may leave unsaved); a genuine file declares exactly what its model builds.
SLACK_BYTES = 1024**2


def check_keras_file(path: Path) -> None:
    """Refuse the `.keras` file at `path` when it would make Keras allocate more than it stores
    (see the module docstring).

    Raises:
        InputFileError: the entry, dataset or variable at fault, named.
        Exception: what Keras raises deserialising the config (safe_mode refusals included), for the loader to map.
    """
    with _archive(path) as archive:
        infos = _entries(archive, path)
        if WEIGHTS not in infos:
            found = (
                f"a '{NPZ_WEIGHTS}', which normbridge does not read"
                if NPZ_WEIGHTS in infos
                else f"entries {sorted(infos)[:10]}"
            )
            raise InputFileError(
                f"'{path}' holds no '{WEIGHTS}' ({found}); save the model with model.save('model.keras'), "
                "which writes its weights there."
            )
        if CONFIG not in infos:
            raise InputFileError(f"'{path}' holds no '{CONFIG}'; save the model with model.save('model.keras').")
        weights = _declared(path, archive, infos[WEIGHTS])
        config = _config(archive.read(CONFIG), path)
    budget = weights.declared + SLACK_BYTES
    try:
        variables = built_variables(config, budget)
    except VariablesOverBudget as over:
        raise InputFileError(
            f"'{path}' entry '{CONFIG}' builds a layer that reads its variable {over.variable} while it is built, "
            f"{over.read} bytes in all, but '{WEIGHTS}' declares {weights.declared} bytes, so Keras would allocate "
            "variables the file cannot fill; save the model again with model.save."
        ) from None
    built = sum(variable.bytes for variable in variables)
    if built > budget:
        largest = max(variables, key=lambda variable: variable.bytes)
        raise InputFileError(
            f"'{path}' entry '{CONFIG}' builds {len(variables)} variables of {built} bytes (the largest {largest}, "
            f"{largest.bytes} bytes) but '{WEIGHTS}' declares {weights.declared} bytes in {weights.datasets} datasets, "
            "so Keras would allocate and initialise variables the file cannot fill; save the model again with model.save."
        )


def declared_weight_bytes(path: Path) -> int:
    """The bytes the weights of the `.keras` file at `path` declare, from HDF5 metadata (0 when it holds no weights
    file, which its loader refuses).

    Raises:
        InputFileError: not a zip, a bomb among the entries or the weights' datasets.
    """
    with _archive(path) as archive:
        infos = _entries(archive, path)
        return _declared(path, archive, infos[WEIGHTS]).declared if WEIGHTS in infos else 0


def _declared(path: Path, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> DeclaredWeights:
    with entry_file(path, archive, info) as weights:
        return declared_weights(weights, info.file_size, f"'{path}' entry '{WEIGHTS}'")


def _archive(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise InputFileError(
            f"'{path}' is not a .keras file (not a zip file: {error}); save the model with model.save('model.keras')."
        ) from error


def _entries(archive: zipfile.ZipFile, path: Path) -> dict[str, zipfile.ZipInfo]:
    """Entries by name; a duplicate name, or an entry that unpacks to far more than it stores,
    is refused before anything is read."""
    infos: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        if info.compress_type != zipfile.ZIP_STORED and info.file_size > max(
            MIN_BOMB_BYTES, MAX_DEFLATE_RATIO * info.compress_size
        ):
            raise InputFileError(
                f"'{path}' entry '{info.filename}' unpacks to {info.file_size} bytes from {info.compress_size}, more than "
                f"{MAX_DEFLATE_RATIO} times its stored size (a zip bomb); model.save stores entries plainly, save it again."
            )
        if info.filename in infos:
            raise InputFileError(
                f"'{path}' holds the entry '{info.filename}' twice; readers would disagree on which one counts, save it again."
            )
        infos[info.filename] = info
    return infos


def _config(data: bytes, path: Path) -> dict:
    try:
        config = json.loads(data)
    except (UnicodeDecodeError, ValueError) as error:
        raise InputFileError(
            f"'{path}' entry '{CONFIG}' is not JSON ({error}); save the model again with model.save."
        ) from error
    if not isinstance(config, dict):
        raise InputFileError(
            f"'{path}' entry '{CONFIG}' holds a {type(config).__name__}, not a serialized model (an object); "
            "save the model again with model.save."
        )
    return config


__all__ = ["NPZ_WEIGHTS", "SLACK_BYTES", "check_keras_file", "declared_weight_bytes"]
