"""Reading one normalization op call of a torch.export graph: its arguments, its module, its state tensors and its spec.

The bottom of reading a program's normalizations: exported_program.py walks a program's calls with these, and
exported_computed.py reads the native op inside a hand-written module with the same reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas import NormbridgeError, NormSpec, Source, SpecError
from schemas.floats import dtype_default_eps
from schemas.kinds import KIND_INFO

from ..common import numpy_from_tensor
from ..torch_internals import op_name, op_schema, torch_version


#: aten op (schema name) -> kind: a normalization call in a torch.export graph (recognizers/aten_ops.py), and the native
#: op inside a hand-written module (norm_graph.py).
OP_KINDS: dict[str, str] = {op: kind for kind, info in KIND_INFO.items() for op in info.aten_ops}
#: torch.nn class name -> kind, to recognise a module whose op was decomposed (and InstanceNorm run as a batch op).
MODULE_KINDS: dict[str, str] = {
    name: kind for kind, info in KIND_INFO.items() for name in info.classes.get("torch", ())
}


def module_kind(type_name: str | None) -> str | None:
    """The kind of a torch.nn class name (from a node's nn_module_stack), or None."""
    return MODULE_KINDS.get(type_name or "")


#: Ops that only reshape, repeat or alias a tensor: followed back to find the parameter they read.
_PASS_THROUGH = frozenset(
    {
        "aten::repeat",
        "aten::view",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::alias",
        "aten::clone",
        "aten::expand",
        "aten::detach",
    }
)


_DTYPE_NAMES = {
    "torch.bfloat16": "bfloat16",
    "torch.float16": "float16",
    "torch.float32": "float32",
    "torch.float64": "float64",
}


@dataclass(frozen=True)
class ExportedNormLayer:
    """One normalization call in an ExportedProgram's graph.

    `spec` is None when the call could not be read (`problem` says why), or when the op was
    decomposed into primitive ops and only the module metadata remains (`native` False).
    """

    path: str
    kind: str
    op: str
    module_type: str | None
    spec: NormSpec | None
    training: bool
    native: bool = True
    problem: str | None = None


def is_exported_program(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    if not module.startswith("torch."):
        return False
    import torch

    return isinstance(obj, torch.export.ExportedProgram)


class _Reader:
    """Resolves op arguments to tensors of the program's state and builds the spec of one call."""

    def __init__(self, program: Any):
        self.version = torch_version()
        signature = program.graph_signature
        self.placeholders: dict[str, str] = {
            **signature.inputs_to_parameters,
            **signature.inputs_to_buffers,
            **getattr(signature, "inputs_to_lifted_tensor_constants", {}),
        }
        self.state = program.state_dict
        self.constants = program.constants

    def read(self, node: Any, kind: str, module_path: str | None, module_type: str | None) -> ExportedNormLayer:
        op = str(node.target)
        schema_name = op_name(node)
        path = module_path or node.name
        arguments = _arguments(node)
        training = _training(schema_name, arguments, node)
        try:
            spec = self._spec(node, path, kind, op, schema_name, arguments, module_type, training)
        except NormbridgeError as error:
            return ExportedNormLayer(path, kind, op, module_type, None, training, problem=str(error))
        except Exception as error:  # an argument this reader does not understand: report, never crash the inspection
            return ExportedNormLayer(
                path, kind, op, module_type, None, training, problem=f"{type(error).__name__}: {error}"
            )
        return ExportedNormLayer(path, kind, op, module_type, spec, training)

    def tensor(self, value: Any, path: str, setting: str) -> np.ndarray | None:
        """The state tensor an op argument reads, following reshapes/repeats back to a parameter or buffer."""
        if value is None:
            return None
        node = value
        while op_name(node) in _PASS_THROUGH:
            node = node.args[0]
        name = self.placeholders.get(getattr(node, "name", None))
        if name is None:
            raise SpecError(
                f"the {setting} argument is computed by the graph ({getattr(value, 'name', value)!r}), not a parameter or buffer, so its value is unknown.",
                layer=path,
                setting=setting,
            )
        tensor = self.state[name] if name in self.state else self.constants[name]
        return numpy_from_tensor(tensor.detach().cpu().clone())  # bfloat16 as ml_dtypes' bfloat16, bit for bit

    def counter(self, running_mean: Any) -> np.ndarray | None:
        """num_batches_tracked next to the running mean's buffer, when the module has one."""
        node = running_mean
        while op_name(node) in _PASS_THROUGH:
            node = node.args[0]
        name = self.placeholders.get(getattr(node, "name", None), "")
        prefix = name.rsplit(".", 1)[0] + "." if "." in name else ""
        key = prefix + "num_batches_tracked"
        tensor = self.state.get(key, self.constants.get(key))
        return None if tensor is None else np.array(int(tensor), dtype=np.int64)

    def _spec(self, node, path, kind, op, schema_name, a, module_type, training) -> NormSpec:
        x = _value(a["input"])
        dtype = _dtype(x, path)
        weight, bias = self.tensor(a.get("weight"), path, "scale"), self.tensor(a.get("bias"), path, "bias")
        tensors = {"scale": weight, "bias": bias}
        fields: dict[str, Any] = {}
        eps = a.get("eps")
        eps_origin = "explicit"
        if eps is None:  # rms_norm(eps=None): the eps of the dtype torch computes in, exactly as RMSNorm(eps=None)
            eps, eps_origin = dtype_default_eps(dtype), "dtype_eps"
        rank = None if x is None else len(x.shape)
        info = KIND_INFO[kind]
        if info.running_stats:
            mean, var = a.get("running_mean"), a.get("running_var")
            tracked = mean is not None and var is not None
            reshaped = kind == "instance" and schema_name != "aten::instance_norm"
            fields.update(
                spatial_rank=_spatial_rank(module_type, None if reshaped else rank),
                layout="channels_first",
                track_running_stats=tracked,
            )
            if not reshaped and rank is not None:
                fields["input_rank"] = rank
            if tracked:
                tensors["running_mean"] = self.tensor(mean, path, "running_mean")
                tensors["running_var"] = self.tensor(var, path, "running_var")
                count = self.counter(mean)
                if count is not None:
                    tensors["num_batches_tracked"] = count
                momentum = float(a["momentum"])
                if momentum == 0.0 and not training and count is not None:
                    # torch/nn/modules/batchnorm.py passes exponential_average_factor=0.0 at eval when momentum is None.
                    momentum = None
                fields.update(
                    momentum=momentum,
                    momentum_convention=None if momentum is None else "batch_weight",
                    variance_estimator="unbiased",
                )
            per_channel = next((t for t in (tensors.get("running_mean"), weight) if t is not None), None)
            fields["num_features"] = int(per_channel.shape[0]) if per_channel is not None else int(x.shape[1])
        elif kind == "group":
            groups = a["num_groups"] if "num_groups" in a else a["group"]
            channels = int(weight.shape[0]) if weight is not None else int(a["C"] if "C" in a else x.shape[1])
            fields.update(num_features=channels, num_groups=int(groups), layout="channels_first")
            if schema_name == "aten::group_norm" and rank is not None:
                fields["input_rank"] = rank
        else:
            fields.update(normalized_shape=tuple(int(d) for d in a["normalized_shape"]))
            if rank is not None:
                fields["input_rank"] = rank
        return NormSpec(
            name=path,
            kind=kind,
            eps=float(eps),
            eps_origin=eps_origin,
            scale=weight is not None,
            bias=bias is not None and info.bias,
            training=training if info.running_stats else False,
            dtype=dtype,
            source=Source(framework="torch", framework_version=self.version, layer_type=op),
            tensors={name: t for name, t in tensors.items() if t is not None},
            **fields,
        )


def _arguments(node: Any) -> dict[str, Any]:
    """The op's arguments by schema name (positional, keyword or default)."""
    values: dict[str, Any] = {}
    for i, argument in enumerate(op_schema(node.target).arguments):
        if i < len(node.args):
            values[argument.name] = node.args[i]
        elif argument.name in node.kwargs:
            values[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            values[argument.name] = argument.default_value
    return values


def _training(schema_name: str, a: dict, node: Any) -> bool:
    """The call's mode: the op's training flag where the statistics are tracked (otherwise it is always True)."""
    if schema_name == "aten::_native_batch_norm_legit_no_training":
        return False
    if schema_name == "aten::instance_norm":
        return bool(a["use_input_stats"]) and a.get("running_mean") is not None
    if "training" in a:
        return bool(a["training"]) and a.get("running_mean") is not None
    return False


def module_of(node: Any) -> tuple[str | None, str | None]:
    """(path, class name) of the innermost module that produced `node`, from nn_module_stack."""
    stack = node.meta.get("nn_module_stack") if hasattr(node, "meta") else None
    if not stack:
        return None, None
    path, type_name = list(stack.values())[-1]
    type_name = type_name if isinstance(type_name, str) else getattr(type_name, "__qualname__", str(type_name))
    return (path or None), type_name.rsplit(".", 1)[-1]


def _value(node: Any) -> Any:
    """The example value (a FakeTensor) recorded for a node, or None."""
    return node.meta.get("val") if hasattr(node, "meta") else None


def _dtype(x: Any, path: str) -> str:
    name = str(getattr(x, "dtype", "torch.float32"))
    if name not in _DTYPE_NAMES:
        raise SpecError(
            f"the input is {name}, expected bfloat16, float16, float32 or float64.", layer=path, setting="dtype"
        )
    return _DTYPE_NAMES[name]


def _spatial_rank(module_type: str | None, rank: int | None) -> int:
    """1, 2 or 3: from the class name (BatchNorm2d) when known, else from the input's rank."""
    if module_type and module_type[-2:] in ("1d", "2d", "3d") and module_type[-2].isdigit():
        return int(module_type[-2])
    return max(1, min(3, (rank or 4) - 2))
