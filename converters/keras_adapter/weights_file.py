"""What a `.keras` file's `model.weights.h5` declares, read from its HDF5 metadata before Keras reads a weight.

Keras reads each weight with `np.array(dataset)`: HDF5 allocates what the dataset's shape declares and fills what the
file does not store with the dataset's fill value. A dataset that is chunked, gzip-compressed and never written
declares 256 MiB in a 15 KB file (+1 GiB resident once Keras read it); Keras itself refuses only datasets over 4 GiB
that declare 1000 times what they store. Every link of the file is visited here through h5py's metadata alone (shape,
dtype, storage size and attribute headers; no dataset is read), and the file is refused when:

- a link is soft or external, or a dataset's data is external or virtual (it would be read from another file);
- a dataset declares bytes and stores none (never written: it reads back as its fill value, whatever that is);
- a dataset declares more than MAX_DEFLATE_RATIO times what it stores (above MIN_BOMB_BYTES), or all of them together
  do against the size of the weights file: `model.save` stores weights uncompressed (1x), and the zip accounting allows
  the same 100x;
- the datasets store more than the file holds, or an attribute declares more than the file holds (a file that lies
  about its layout).

So what passes declares at most MAX_DEFLATE_RATIO times the weights file's size (a MiB at least), whatever overlapping
chunks or fill values it uses. A server also counts the declared bytes against its upload limit
(`registry/http/uploads.py`), and `keras_file_checks` bounds what the config builds by them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, BinaryIO

import h5py
import numpy as np

from schemas import InputFileError

WEIGHTS = "model.weights.h5"
#: Declared over stored bytes a dataset (above MIN_BOMB_BYTES), and the whole weights file, may reach: the zip ratio the
#: .pt2 reader and Keras's own zip check allow. Genuine Keras weights are stored uncompressed, at 1x.
MAX_DEFLATE_RATIO = 100
MIN_BOMB_BYTES = 1024**2


@dataclass(frozen=True)
class DeclaredWeights:
    """The datasets of a weights file: the bytes their shapes declare, the bytes they store, how many there are."""

    declared: int
    stored: int
    datasets: int


def declared_weights(source: BinaryIO, size: int, where: str) -> DeclaredWeights:
    """What the HDF5 file `source` (a seekable file of `size` bytes; `where` names it in messages) declares, refused as
    above before any dataset is read.

    Raises:
        InputFileError: not an HDF5 file, a link or dataset that reads another file, or a dataset bomb (named).
    """
    try:
        with h5py.File(source, "r") as weights:
            found = _datasets(weights, where, size)
    except InputFileError:
        raise
    except Exception as error:  # h5py raises OSError, KeyError, ValueError, RuntimeError on a malformed file
        raise InputFileError(
            f"{where} is not a readable HDF5 file ({type(error).__name__}: {str(error)[:200]}); "
            "save the model again with model.save."
        ) from error
    declared, stored = sum(d for _, d, _ in found), sum(s for _, _, s in found)
    if stored > size:
        raise InputFileError(
            f"{where} says its datasets store {stored} bytes but the file holds {size}; the file is corrupt or "
            "crafted, save the model again with model.save."
        )
    if declared > max(MIN_BOMB_BYTES, MAX_DEFLATE_RATIO * size):
        raise InputFileError(
            f"{where} declares {declared} bytes of weights in a {size}-byte file, more than {MAX_DEFLATE_RATIO} times "
            "its size (a decompression bomb); save the model again with model.save, which stores weights uncompressed."
        )
    return DeclaredWeights(declared, stored, len(found))


def _datasets(weights: h5py.File, where: str, size: int) -> list[tuple[str, int, int]]:
    """(name, declared bytes, stored bytes) of every dataset, each link and attribute checked on the way."""
    links: list[tuple[str, Any]] = []
    weights.visititems_links(
        lambda name, link: links.append((name, link))
    )  # names only: h5py's visit cannot raise through
    _check_attributes(weights, f"{where} root group", size)
    found = []
    for name, link in links:
        if not isinstance(link, h5py.HardLink):
            raise InputFileError(
                f"{where} holds a {type(link).__name__} at '{name}', which reads another object or file; "
                "Keras writes plain groups and datasets, save the model again with model.save."
            )
        item = weights[name]
        _check_attributes(item, f"{where} object '{name}'", size)
        if isinstance(item, h5py.Dataset):
            found.append(_dataset(item, f"{where} dataset '{name}'"))
    return found


def _dataset(dataset: h5py.Dataset, where: str) -> tuple[str, int, int]:
    if dataset.external or dataset.is_virtual:
        raise InputFileError(
            f"{where} keeps its data in another file (an external or virtual dataset); save the model again with model.save."
        )
    declared = math.prod(dataset.shape) * dataset.dtype.itemsize if dataset.shape is not None else 0
    stored = dataset.id.get_storage_size()
    if declared and not stored:
        raise InputFileError(
            f"{where} declares {_shape(dataset)} ({declared} bytes) and stores none (a dataset never written reads "
            "back as its fill value); save the model again with model.save."
        )
    if declared > max(MIN_BOMB_BYTES, MAX_DEFLATE_RATIO * stored):
        raise InputFileError(
            f"{where} declares {_shape(dataset)} ({declared} bytes) and stores {stored}, more than {MAX_DEFLATE_RATIO} "
            "times as much (a decompression bomb); save the model again with model.save, which stores weights uncompressed."
        )
    return dataset.name, declared, stored


def _check_attributes(item: Any, where: str, size: int) -> None:
    """An attribute is stored whole in the file's headers: one declaring more than the file holds is crafted."""
    for name in item.attrs:
        attribute = item.attrs.get_id(name)
        shape = attribute.shape
        declared = math.prod(shape) * attribute.dtype.itemsize if shape is not None else 0
        if declared > size:
            raise InputFileError(
                f"{where} has an attribute '{name}' declaring {declared} bytes in a {size}-byte file; the file is "
                "corrupt or crafted, save the model again with model.save."
            )


def _shape(dataset: h5py.Dataset) -> str:
    return f"{np.dtype(dataset.dtype).name}{list(dataset.shape)}"


__all__ = ["MAX_DEFLATE_RATIO", "MIN_BOMB_BYTES", "WEIGHTS", "DeclaredWeights", "declared_weights"]
