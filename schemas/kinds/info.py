"""`KindInfo`: every fact about one normalizer kind, in the kind's own module.

The converters, the whole-model tools and the registry read these instead of keeping their
own tables, so a kind's ONNX op, its opset, its aten ops, its stock classes and each
framework's default eps are written once (`schemas/kinds/<kind>.py`). Names of classes and
ops are facts of the formats, not imports: schemas imports no framework.

A kind need not have a native ONNX op nor a stock class in every framework (a kind from a paper that no framework
ships): `onnx_op` is then None (ONNX writes it as its decomposition, or refuses it naming the kind) and `classes`
lacks the framework (its recognizers know no class of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class KindInfo:
    """The facts of one kind.

    Attributes:
        kind: the name in the spec's vocabulary.
        summary: what it computes, in one line.
        trailing: statistics over the trailing `normalized_shape` axes (else per channel, with a layout).
        running_stats: the kind may track running statistics, so its output depends on a train/eval mode.
        bias: the kind can have a bias (RMSNorm cannot).
        required: spec fields the kind needs, checked in this order.
        forbidden: spec fields that mean nothing for the kind, checked in this order.
        classes: framework -> the stock layer class names that compute the kind (torch.nn, keras.layers); a framework
            without a stock class of the kind is left out (`stock_classes` answers () for it).
        default_eps: framework -> the eps a layer gets when none is given; None where the framework
            derives it (PyTorch RMSNorm: floats.dtype_default_eps).
        onnx_op: the native ONNX op; None when ONNX has none for the kind.
        onnx_opset: the first opset holding `onnx_op` in the form normbridge writes; None without an op.
        onnx_inputs: the spec tensor fed by `onnx_op`'s inputs 1, 2, ... (input 0 is the data).
        aten_ops: the aten ops (schema names) torch.export writes for the kind, before and after
            run_decompositions().
    """

    kind: str
    summary: str
    trailing: bool
    running_stats: bool
    bias: bool
    required: tuple[str, ...]
    forbidden: tuple[str, ...]
    classes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default_eps: Mapping[str, float | None]
    onnx_op: str | None = None
    onnx_opset: int | None = None
    onnx_inputs: tuple[str, ...] = ()
    aten_ops: tuple[str, ...] = field(default=())

    def stock_classes(self, framework: str) -> tuple[str, ...]:
        """The names of `framework`'s stock classes of the kind; () where it ships none."""
        return tuple(self.classes.get(framework, ()))

    def native_in(self, opset: int) -> bool:
        """Whether ONNX `opset` holds the kind's native op (never, for a kind without one)."""
        return self.onnx_op is not None and self.onnx_opset is not None and self.onnx_opset <= opset

    def per_feature_shape(self, spec) -> tuple[int, ...]:
        """The shape of the spec's scale, bias and running statistics."""
        return tuple(spec.normalized_shape) if self.trailing else (spec.num_features,)
