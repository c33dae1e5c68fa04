"""Helpers every PyTorch kind adapter shares: dtypes, bit-exact tensor copies, affine flags, markers."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import torch

from schemas import LayerReport, NormSpec, NotExpressibleError, Source, SpecError

from .. import markers
from .torch_internals import own_tensors, torch_version

TORCH_DTYPES = {
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
}
SPEC_TO_TORCH = {name: dtype for dtype, name in TORCH_DTYPES.items()}
#: The extended settings every stock torch module holds: bfloat16, and float32 statistics of a bf16/fp16 layer.
STOCK_HOLDS = frozenset({"dtype", "compute_dtype"})


def tensor_from_numpy(array: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing `array`'s bits; NumPy's bfloat16 (ml_dtypes) goes through a 16-bit view,
    which torch lacks."""
    if type(array) is not np.ndarray or not (array.flags.c_contiguous and array.flags.writeable):
        # np.require(array, requirements=('C', 'W')) without its Python overhead: ascontiguousarray would make a 0-d
        # array 1-d; torch wants writable memory.
        array = np.require(array, requirements=("C", "W"))
    if array.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def numpy_from_tensor(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy array with the tensor's bits (bfloat16 as ml_dtypes.bfloat16); shares memory where torch allows."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def check_compute_dtype(spec: NormSpec) -> None:
    """Stock modules compute a bf16/fp16 layer's statistics and affine in float32 on the CPU (opmath),
    and cast once at the end.

    So they hold compute_dtype="float32" with the cast after the affine; another compute dtype is refused.
    """
    if spec.compute_dtype is not None and (
        spec.compute_dtype != "float32" or spec.dtype not in ("bfloat16", "float16")
    ):
        raise NotExpressibleError(
            f"a stock torch module computes a {spec.dtype} layer in float32 on the CPU, not in compute_dtype={spec.compute_dtype!r}; "
            "keep the layer in its source framework.",
            layer=spec.name,
            setting="compute_dtype",
            target="torch",
        )


def extended_fields(module: torch.nn.Module, dtype: str) -> dict:
    """compute_dtype remembered from the spec a module was built for, trusted while the module still has a narrow
    dtype."""
    remembered = markers.recall(module).get("compute_dtype")
    return {"compute_dtype": remembered} if remembered == "float32" and dtype in ("bfloat16", "float16") else {}


def spec_dtype(module: torch.nn.Module, name: str, report: LayerReport | None = None) -> str:
    """The spec dtype of a module's floating state (parameters, then buffers, then torch's default, said in
    `report`)."""
    tensors = [t for t in _own_tensors(module) if t.is_floating_point()]
    if not tensors and markers.recall(module).get("dtype") in SPEC_TO_TORCH:
        # A stateless module (no affine, no statistics) has no dtype of its own: use the one it was built for.
        return markers.recall(module)["dtype"]
    dtype = tensors[0].dtype if tensors else torch.get_default_dtype()
    if not tensors and report is not None and dtype in TORCH_DTYPES:
        report.warn(
            f"it holds no tensor, so it has no dtype of its own: read as torch's default dtype {TORCH_DTYPES[dtype]}; a converted "
            "layer takes inputs of that dtype (for another, convert spec.replace(dtype=...))."
        )
    if dtype not in TORCH_DTYPES:
        raise SpecError(
            f"dtype {dtype} is not supported; use float16, float32 or float64 (module.to(torch.float32)).",
            layer=name,
            setting="dtype",
        )
    return TORCH_DTYPES[dtype]


def _own_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """`list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))`, read from the module's own tables
    where its class keeps torch's listing (the generators cost more than the read they serve; a duplicate changes
    neither the first floating tensor nor whether there is one)."""
    if not _stock_listing(type(module)):
        return list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return own_tensors(module)


@functools.lru_cache(maxsize=None)
def _stock_listing(cls: type) -> bool:
    return all(
        getattr(cls, name) is getattr(torch.nn.Module, name)
        for name in ("parameters", "named_parameters", "buffers", "named_buffers", "_named_members")
    )


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A bit-exact NumPy copy of a tensor (detached, on the CPU): one copy (resolving a negative or conjugate view, as a
    clone would)."""
    return numpy_from_tensor(tensor.detach().cpu().resolve_neg().resolve_conj()).copy()


def assign(target: torch.Tensor, array: np.ndarray) -> None:
    """Overwrite `target` with `array` bit-exactly (dtype must already match)."""
    with torch.no_grad():
        copy_into(target, array)


def copy_into(target: torch.Tensor, array: np.ndarray) -> None:
    """`assign` for a caller already inside torch.no_grad() (one block for a module's every tensor)."""
    source = tensor_from_numpy(np.array(array, copy=True, order="C"))
    if source.dtype != target.dtype or tuple(source.shape) != tuple(target.shape):
        raise SpecError(
            f"cannot write a {source.dtype}{tuple(source.shape)} tensor into a {target.dtype}{tuple(target.shape)} one."
        )
    target.copy_(source)


#: Where `write_tensor` notes which module tensor holds which spec tensor (spec tensor -> attribute), for
#: state_slots.TorchRestating.restate.
STATE_SLOTS = "_normbridge_state_slots"


def write_tensor(module: torch.nn.Module, attribute: str, spec: NormSpec, name: str) -> None:
    """Copy the spec's tensor `name` into `module.<attribute>` bit-exactly, noting the slot
    (the one way from_spec writes tensors)."""
    assign(getattr(module, attribute), spec.tensors[name])
    object.__setattr__(module, STATE_SLOTS, {**getattr(module, STATE_SLOTS, {}), name: attribute})


def layer_name(module: torch.nn.Module, default: str) -> str:
    """PyTorch modules carry no name of their own: use the remembered one, else `default`."""
    return markers.recall(module).get("name") or default


def source(module: torch.nn.Module) -> Source:
    return _source(type(module).__name__)


@functools.lru_cache(maxsize=256)
def _source(layer_type: str) -> Source:
    """Source is frozen: one per class name serves every spec read from such a module
    (a read costs a validation less)."""
    return Source(framework="torch", framework_version=torch_version(), layer_type=layer_type)


def read_affine(module: torch.nn.Module, name: str, report: LayerReport) -> tuple[bool, bool, dict]:
    """(scale, bias, tensors) from weight/bias; a frozen identity emitted by normbridge counts as absent.

    PyTorch cannot have a bias without a weight, so a spec with bias but no scale is
    emitted as a frozen weight of ones; it reads back as "no scale" only if it still
    is all ones and frozen.
    """
    spec_dtype(module, name)  # refuse unsupported dtypes before touching any tensor
    frozen = set(markers.recall(module).get("frozen_identity", ()))
    tensors: dict[str, np.ndarray] = {}
    flags = {}
    for spec_name, attr, identity in (("scale", "weight", 1.0), ("bias", "bias", 0.0)):
        param = getattr(module, attr, None)
        if param is None:
            flags[spec_name] = False
            continue
        if spec_name in frozen:
            if not param.requires_grad and bool(torch.all(param == identity)):
                flags[spec_name] = False
                continue
            report.warn(
                f"'{attr}' was emitted as a frozen identity but has since changed; it is read as a learned {spec_name}."
            )
        flags[spec_name] = True
        tensors[spec_name] = to_numpy(param)
    return flags["scale"], flags["bias"], tensors


def write_affine(module: torch.nn.Module, spec: NormSpec, report: LayerReport) -> None:
    """Copy scale/bias into weight/bias; absent ones that PyTorch forces become frozen identities."""
    frozen = []
    for spec_name, attr, identity in (("scale", "weight", 1.0), ("bias", "bias", 0.0)):
        param = getattr(module, attr, None)
        if param is None:
            continue
        if getattr(spec, spec_name):
            write_tensor(module, attr, spec, spec_name)
        else:
            with torch.no_grad():
                param.fill_(identity)
            param.requires_grad_(False)
            frozen.append(spec_name)
            report.add(
                spec_name,
                False,
                f"frozen {attr} = {identity:g}",
                "stored",
                f"PyTorch {type(module).__name__} cannot have a bias without a weight",
            )
    if frozen:
        markers.remember(module, frozen_identity=tuple(frozen))


def affine_kwargs(spec: NormSpec, affine_name: str = "affine") -> dict:
    """Constructor flags for (scale, bias): PyTorch has affine plus bias=...,
    so scale-less bias needs an identity weight."""
    if not spec.scale and not spec.bias:
        return {affine_name: False}
    return {affine_name: True, "bias": spec.bias}


def finish(module: torch.nn.Module, spec: NormSpec, report: LayerReport) -> torch.nn.Module:
    """Mode, name marker and report lines every adapter ends with."""
    module.train(spec.training)
    report.add("training", spec.training, note="module.training")
    markers.remember(module, name=spec.name, dtype=spec.dtype, compute_dtype=spec.compute_dtype)
    if spec.compute_dtype is not None:
        report.add(
            "compute_dtype",
            spec.compute_dtype,
            note="torch computes bf16/fp16 norms in float32 on the CPU and casts once, after the affine",
        )
    report.target_op = type(module).__name__
    report.native = True
    return module
