"""Inputs to replay through a model: a user's .npy/.npz file, or a seeded random sample for its input shape.

Files are read with `allow_pickle=False`: an object array in a .npy/.npz is a pickle and is
refused. The leading axis of every input is the batch axis. A dimension a model leaves open
(a symbolic batch, a Keras `None` spatial size) gets `batch_size` for the batch and
`DEFAULT_OPEN_DIM` elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schemas import InputFileError, UnsupportedObjectError
from schemas.floats import is_float_dtype

from ...adapters import REGISTRY
from ...model_values import InputSpec
from ..file_headers import check_sample_header

#: Size given to an open non-batch dimension in a random sample.
DEFAULT_OPEN_DIM = 32
DEFAULT_BATCH = 4
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Sample:
    """Arrays to feed a model, one per input, sharing the batch axis 0."""

    arrays: tuple[np.ndarray, ...]
    names: tuple[str, ...]
    description: str
    seed: int | None = None
    path: str | None = None

    @property
    def batch_size(self) -> int:
        return int(self.arrays[0].shape[0])

    def rows(self, index) -> tuple[np.ndarray, ...]:
        """The requests at `index` (an int keeps a batch axis of one)."""
        if isinstance(index, (int, np.integer)):
            index = slice(int(index), int(index) + 1)
        return tuple(a[index] for a in self.arrays)

    def batches(self, size: int | None) -> Iterator[tuple[np.ndarray, ...]]:
        """Consecutive batches of `size` requests (the last one may be smaller); None = one batch."""
        size = size or self.batch_size
        for start in range(0, self.batch_size, size):
            yield tuple(a[start : start + size] for a in self.arrays)


def input_specs(model: Any) -> list[InputSpec]:
    """The inputs of an onnx.ModelProto, a torch ExportedProgram or a Keras model (its model adapter's).

    A torch.nn.Module does not know its input shape: pass a sample for it.
    """
    return REGISTRY.model_adapter_of(model).input_specs(model)


def merge_specs(first: Sequence[InputSpec], second: Sequence[InputSpec]) -> list[InputSpec]:
    """Combine two views of the same inputs (source and serving): a size fixed in either is fixed."""
    if not first:
        return list(second)
    if not second:
        return list(first)
    if len(first) != len(second):
        raise InputFileError(
            f"the source takes {len(first)} inputs and the serving model {len(second)}; they are not the same model."
        )
    merged = []
    for a, b in zip(first, second):
        if len(a.shape) != len(b.shape):
            raise InputFileError(
                f"input '{a.name}' has rank {len(a.shape)} in the source and '{b.name}' rank {len(b.shape)} in the serving model; "
                "export the serving model from this source."
            )
        merged.append(InputSpec(b.name, tuple(x if x is not None else y for x, y in zip(a.shape, b.shape)), b.dtype))
    return merged


def random_sample(specs: Sequence[InputSpec], batch_size: int = DEFAULT_BATCH, seed: int = DEFAULT_SEED) -> Sample:
    """Seeded inputs for `specs`: standard normal floats, integers in [0, 8), random booleans."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        shape = tuple(
            (batch_size if i == 0 else DEFAULT_OPEN_DIM) if d is None else d for i, d in enumerate(spec.shape)
        )
        dtype = np.dtype(spec.dtype)
        if is_float_dtype(dtype):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind in "iu":
            arrays.append(rng.integers(0, 8, size=shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            raise UnsupportedObjectError(
                f"input '{spec.name}' has dtype {dtype}, for which no random sample is defined; pass a sample file."
            )
    values = ", ".join(f"{a.dtype}{list(a.shape)} {_drawn(a.dtype)}" for a in arrays)
    requests = int(arrays[0].shape[0]) if arrays and arrays[0].ndim else batch_size
    fixed = (
        "" if not specs or specs[0].shape[:1] in ((), (None,)) else f"; the model's batch size is fixed at {requests}"
    )
    return Sample(
        tuple(arrays),
        tuple(s.name for s in specs),
        f"seeded random batch of {_requests(requests)} (seed {seed}{fixed}): {values}",
        seed=seed,
    )


def _drawn(dtype: np.dtype) -> str:
    """How random_sample draws values of `dtype`, as the contract's header says it."""
    if is_float_dtype(dtype):
        return "standard normal"
    if dtype.kind in "iu":
        return "integers in [0, 8) (token ids or indices)"
    return "random booleans"


def _requests(count: int) -> str:
    return f"{count} request" + ("" if count == 1 else "s")


def load_sample(path: str | Path, specs: Sequence[InputSpec] | None = None) -> Sample:
    """Read a .npy (one input) or .npz (one array per input) without unpickling anything.

    With `specs`, .npz arrays are matched by input name when every name is present (else in
    file order), cast to the input dtype, and checked against the fixed dimensions.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"sample file '{path}' does not exist; pass a .npy or .npz file.")
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".npz"):
        raise InputFileError(
            f"sample file '{path}' is a '{suffix}' file; pass a .npy (one input) or .npz (one array per input)."
        )
    check_sample_header(path)  # magic and header first: a file that is not NumPy's is refused before it is read
    try:
        loaded = np.load(path, allow_pickle=False)
        if suffix == ".npy":
            names, arrays = ["input"], [np.asarray(loaded)]
        else:
            with loaded:
                names = list(loaded.files)
                arrays = [np.asarray(loaded[name]) for name in names]
    except ValueError as error:
        raise InputFileError(
            f"sample file '{path}' holds object arrays, which can only be read by unpickling (refused: it can execute code); save plain numeric arrays."
        ) from error
    except OSError as error:
        raise InputFileError(f"sample file '{path}' is not a readable NumPy file ({error}).") from error
    if not arrays:
        raise InputFileError(f"sample file '{path}' holds no arrays.")
    stored = [a.dtype for a in arrays]
    if specs:
        names, arrays, stored = _match(path, names, arrays, specs)
    if any(a.ndim == 0 for a in arrays) or len({a.shape[0] for a in arrays}) != 1:
        raise InputFileError(
            f"sample file '{path}': every array needs the same leading batch axis; got shapes {[list(a.shape) for a in arrays]}."
        )
    # a cast to the model's input dtype is said, never silent: int64 pixels read as float32 are another input than the
    # file's
    shapes = ", ".join(
        f"{a.dtype}{list(a.shape)}" + ("" if was == a.dtype else f" (cast from the file's {was})")
        for a, was in zip(arrays, stored)
    )
    return Sample(
        tuple(arrays), tuple(names), f"{path.name}: {_requests(int(arrays[0].shape[0]))} {shapes}", path=str(path)
    )


def _match(
    path: Path, names: list[str], arrays: list[np.ndarray], specs: Sequence[InputSpec]
) -> tuple[list[str], list[np.ndarray], list]:
    """(the inputs' names, the arrays cast to their dtypes, the dtypes the file stored them in),
    in the model's input order."""
    if len(arrays) != len(specs):
        raise InputFileError(
            f"sample file '{path}' holds {len(arrays)} arrays but the model takes {len(specs)} inputs ({', '.join(s.name for s in specs)})."
        )
    if len(arrays) > 1 and all(s.name in names for s in specs):
        arrays = [arrays[names.index(s.name)] for s in specs]
    stored = [a.dtype for a in arrays]
    matched = []
    for array, spec in zip(arrays, specs):
        if array.ndim != len(spec.shape) or any(
            d is not None and d != n for d, n in zip(spec.shape[1:], array.shape[1:])
        ):
            raise InputFileError(
                f"sample file '{path}': input '{spec.name}' expects shape {['batch' if d is None else d for d in spec.shape]}, got {list(array.shape)}; "
                "save the sample in the model's layout (Keras models are channels-last)."
            )
        matched.append(array.astype(spec.dtype, copy=False))
    return [s.name for s in specs], matched, stored


def as_sample(
    sample: Any, specs: Sequence[InputSpec] | None, batch_size: int = DEFAULT_BATCH, seed: int = DEFAULT_SEED
) -> Sample:
    """A Sample from None (seeded random for `specs`), a path, an array, a sequence or dict of arrays, or a Sample."""
    if isinstance(sample, Sample):
        return sample
    if sample is None:
        if not specs:
            raise UnsupportedObjectError(
                "no input shape is known for this model; pass a sample (a NumPy array, or a .npy/.npz file)."
            )
        return random_sample(specs, batch_size, seed)
    if isinstance(sample, (str, Path)):
        return load_sample(sample, specs)
    if isinstance(sample, dict):
        names, arrays = list(sample), [_numpy(v) for v in sample.values()]
    elif isinstance(sample, (list, tuple)):
        arrays = [_numpy(v) for v in sample]
        names = (
            [s.name for s in specs]
            if specs and len(specs) == len(arrays)
            else [f"input_{i}" for i in range(len(arrays))]
        )
    else:
        arrays, names = [_numpy(sample)], [specs[0].name if specs else "input"]
    if specs and len(specs) == len(arrays):  # float64 NumPy data for a float32 model: cast within the same kind only
        arrays = [
            a.astype(s.dtype, copy=False) if a.dtype.kind == np.dtype(s.dtype).kind else a
            for a, s in zip(arrays, specs)
        ]
    shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in arrays)
    count = f"{_requests(int(arrays[0].shape[0]))} " if arrays and arrays[0].ndim else ""
    return Sample(tuple(arrays), tuple(names), f"given arrays: {count}{shapes}")


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    return np.asarray(value)
