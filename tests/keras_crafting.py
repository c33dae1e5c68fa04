"""Hostile `.keras` files that declare more than they store: a genuine `model.save` file with an entry rewritten.

`genuine_keras(path)` saves a real Keras 3 model (Dense 6->4, BatchNormalization), `genuine_normalization_keras(path)`
one holding a Normalization layer. `craft(genuine, out, ...)` copies
it entry by entry while editing config.json (`edit_config`), editing model.weights.h5 in place with h5py
(`edit_weights`), or swapping the weights file for another entry (`replace_weights`): what an attacker does with
`zipfile` and `h5py`. The edits below are the attacks of issue 30, holes 4 and 5; each keeps the file small.
"""

from __future__ import annotations

import io
import json
import math
import random
import zipfile
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

KERNEL = "layers/dense/vars/0"
CHUNK = 1024


def genuine_keras(path: Path) -> Path:
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()
    inputs = keras.Input((6,), name="inputs")  # named: Keras numbers unnamed layers per process
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    keras.Model(inputs, keras.layers.BatchNormalization(name="bn")(hidden)).save(path)
    return path


def genuine_normalization_keras(path: Path) -> Path:
    """A model whose Normalization layer (not adapted) reads its mean and variance while it is built."""
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()
    inputs = keras.Input((6,), name="inputs")
    keras.Model(inputs, keras.layers.Normalization(name="norm")(inputs)).save(path)
    return path


def craft(
    genuine: Path,
    out: Path,
    edit_config: Callable[[dict], None] | None = None,
    edit_weights: Callable[[h5py.File], None] | None = None,
    replace_weights: tuple[str, bytes] | None = None,
) -> Path:
    """`genuine` with config.json and/or model.weights.h5 edited (every other entry copied byte for byte)."""
    with zipfile.ZipFile(genuine) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "config.json" and edit_config is not None:
                config = json.loads(data)
                edit_config(config)
                data = json.dumps(config).encode()
            if info.filename == "model.weights.h5" and edit_weights is not None:
                image = io.BytesIO(data)
                with h5py.File(image, "a") as weights:
                    edit_weights(weights)
                data = image.getvalue()
            if info.filename == "model.weights.h5" and replace_weights is not None:
                target.writestr(replace_weights[0], replace_weights[1])
                continue
            target.writestr(info, data)
    return out


def _gzip_kernel(weights: h5py.File, n: int, fill: float = 0.0) -> h5py.Dataset:
    """The Dense kernel replaced by a chunked, gzip-compressed float32[n, n] dataset, nothing written yet."""
    del weights[KERNEL]
    return weights.create_dataset(
        KERNEL, shape=(n, n), dtype="float32", chunks=(min(n, CHUNK), min(n, CHUNK)), compression="gzip", fillvalue=fill
    )


def unwritten_kernel(n: int, fill: float = 0.0) -> Callable[[h5py.File], None]:
    """Hole 4 as found: a dataset never written, whose every element reads back as the fill value."""
    return lambda weights: _gzip_kernel(weights, n, fill)


def one_chunk_written(n: int) -> Callable[[h5py.File], None]:
    """One chunk of ones written, every other chunk left to the fill value: the dataset stores a few KB."""

    def edit(weights: h5py.File) -> None:
        _gzip_kernel(weights, n)[:CHUNK, :CHUNK] = np.ones((CHUNK, CHUNK), np.float32)

    return edit


def zeros_written(n: int) -> Callable[[h5py.File], None]:
    """Every chunk written with zeros, gzip at about 1000x: a genuine compressed dataset, far past 100x."""

    def edit(weights: h5py.File) -> None:
        kernel = _gzip_kernel(weights, n)
        for row in range(0, n, CHUNK):
            kernel[row : row + CHUNK] = np.zeros((min(CHUNK, n - row), n), np.float32)

    return edit


def many_small_zero_datasets(count: int) -> Callable[[h5py.File], None]:
    """`count` extra datasets of 1 MiB of zeros each, gzip: each under the per-dataset floor,
    together far past 100x the file."""

    def edit(weights: h5py.File) -> None:
        group = weights.create_group("padding")
        for index in range(count):
            group.create_dataset(str(index), data=np.zeros(1 << 18, np.float32), chunks=(1 << 18,), compression="gzip")

    return edit


def noisy_kernel(mib: int) -> Callable[[h5py.File], None]:
    """A kernel of `mib` MiB that gzip packs about 60x (64 random bytes in every 4 KiB): under the 100x ratio, so only a
    limit on what the weights declare refuses it."""

    def edit(weights: h5py.File) -> None:
        side = math.isqrt((mib << 20) // 4)  # float32[side, side] of `mib` MiB
        kernel = _gzip_kernel(weights, side)
        noise = random.Random(0)
        for row in range(0, side, CHUNK):
            block = np.zeros((min(CHUNK, side - row), side), np.float32)
            flat = block.view(np.uint8).reshape(-1)
            for start in range(0, flat.size, 4096):
                flat[start : start + 64] = np.frombuffer(noise.randbytes(64), np.uint8)
            kernel[row : row + CHUNK] = block

    return edit


def layer(config: dict, name: str) -> dict:
    return next(entry for entry in config["config"]["layers"] if entry["config"].get("name") == name)


def giant_dense(n: int) -> Callable[[dict], None]:
    """Hole 5: the config declares an n x n Dense (input width n, n units); the weights file stays the genuine one."""

    def edit(config: dict) -> None:
        layer(config, "inputs")["config"]["batch_shape"] = [None, n]
        dense = layer(config, "dense")
        dense["config"]["units"] = n
        dense["build_config"] = {"input_shape": [None, n]}
        layer(config, "bn")["build_config"] = {"input_shape": [None, n]}

    return edit


def huge_normalization(n: int) -> Callable[[dict], None]:
    """Hole 5 through a layer that reads its variables in `build`: the Normalization model's input widened to n
    features."""

    def edit(config: dict) -> None:
        layer(config, "inputs")["config"]["batch_shape"] = [None, n]
        layer(config, "norm")["build_config"] = {"input_shape": [None, n]}

    return edit


def npz_weights(elements: int) -> tuple[str, bytes]:
    """A `model.weights.npz` (Keras's other weights format) whose member for the Dense layer is `elements` float32
    zeros, deflated: Keras reads it whole and turns it into a Python list."""
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("layers/dense.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": (elements,)})
            zeros = bytes(1 << 20)
            for _ in range(elements * 4 // len(zeros)):
                member.write(zeros)
    return "model.weights.npz", inner.getvalue()


__all__ = [
    "craft",
    "genuine_keras",
    "genuine_normalization_keras",
    "giant_dense",
    "huge_normalization",
    "many_small_zero_datasets",
    "noisy_kernel",
    "npz_weights",
    "one_chunk_written",
    "unwritten_kernel",
    "zeros_written",
]
