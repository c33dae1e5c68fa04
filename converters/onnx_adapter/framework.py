"""Recognising and running ONNX models that hold one normalization layer (onnxruntime, CPU)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from schemas import NotExpressibleError

from ..adapter import FrameworkAdapter
from .batch import OP as BATCH_NORM, TRAINING_MODE_VERSION
from .layer_graph import element_type
from .proto import DEFAULT_DOMAINS
from .reading import OnnxLayer, models_unchanged, parse


@dataclass(frozen=True)
class Run:
    """What running a layer's model means: the model to run (the layer's own, or its training copy), the outputs to
    fetch (None: every graph output), and whether the result is a training step."""

    layer: OnnxLayer
    model: onnx.ModelProto
    outputs: list[str] | None
    train: bool

    def result(self, values: list[np.ndarray]) -> Any:
        """run_eval's or run_train_step's return value from the fetched `values`."""
        if not self.train:
            return values[0]
        if self.outputs is None:
            return values[0], None, None
        y, mean, var = values
        return y, mean, var


def session(model: onnx.ModelProto):
    """A CPU InferenceSession for `model`, set up as every check's probe is: one thread, no spinning, quiet."""
    import onnxruntime  # only `check` runs models: converting never pays for onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers (untracked BatchNorm outputs) are noise here
    # One normalizer is far too small to gain from worker threads, and idle workers spin on the cores a server shares.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def refuse_unrunnable(layer: OnnxLayer) -> None:
    """Checked on onnxruntime 1.32: its CPU provider has no bfloat16 kernel for the normalization ops (nor their Mul),
    and its Python binding has no NumPy type for bfloat16 outputs. The graph is valid ONNX (checked on write);
    check lists it as skipped."""
    if layer.dtype == "bfloat16":
        import onnxruntime

        raise RuntimeError(
            f"NOT_IMPLEMENTED: onnxruntime {onnxruntime.__version__}'s CPU provider cannot run bfloat16 normalization layers."
        )


def execute(run: Run, x: np.ndarray) -> Any:
    """`run` on `x`, cast to the input type, in a session of its own."""
    refuse_unrunnable(run.layer)
    return run.result(session(run.model).run(run.outputs, {run.layer.input_name: np.asarray(x, dtype=run.layer.dtype)}))


class OnnxFramework(FrameworkAdapter):
    """onnx.ModelProto objects; eval and training steps run in onnxruntime."""

    name = "onnx"
    float32_attributes = True  # epsilon and momentum are float attributes (float32) in every ONNX op

    def kind_of(self, obj: Any) -> str:
        return parse(obj).kind

    def version(self) -> str:
        return onnx.__version__

    def unchanged_objects(self):
        return models_unchanged()

    def natural_layout(self) -> str | None:
        return "channels_first"

    def run_eval(self, obj: Any, x: np.ndarray, in_place: bool = False) -> np.ndarray:
        return execute(self.eval_run(obj), x)

    def run_train_step(
        self, obj: Any, x: np.ndarray, in_place: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        return execute(self.train_run(obj), x)

    def eval_run(self, obj: Any) -> Run:
        """The model as written, every output."""
        layer = parse(obj)
        return Run(layer, layer.model, None, train=False)

    def train_run(self, obj: Any) -> Run:
        """BatchNormalization: a training_mode=1 copy exposing the updated running statistics;
        other ops have no mode."""
        layer = parse(obj)
        if (layer.raw_metadata or {}).get("frozen") is True:
            raise NotExpressibleError(
                "this BatchNormalization holds frozen statistics: ONNX has no training step that keeps them (training_mode=1 would use and "
                "update batch statistics); a frozen layer computes its eval output in training too.",
                layer=layer.name,
                setting="frozen",
                target="onnx",
            )
        if layer.node is None or layer.node.op_type != BATCH_NORM:
            return Run(layer, layer.model, None, train=True)
        if layer.kind == "instance":
            raise NotExpressibleError(
                "this BatchNormalization holds a tracked InstanceNorm's running statistics for eval, and a training step of it would pool "
                "statistics over the batch instead of per instance; train the source layer instead.",
                layer=layer.name,
                setting="training",
                target="onnx",
            )
        model, outputs = _training_copy(layer)
        return Run(layer, model, outputs, train=True)


def _training_copy(layer: OnnxLayer) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of a BatchNormalization model with training_mode=1 and the running statistics as graph outputs.

    training_mode needs BatchNormalization-14: an older opset is raised to 14, whose
    eval semantics are the same. Returns the model and the output names (Y, mean, var).
    """
    model = onnx.ModelProto()
    model.CopyFrom(layer.model)
    node = model.graph.node[0]
    kept = [a for a in node.attribute if a.name != "training_mode"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("training_mode", 1)])
    for opset in model.opset_import:
        if opset.domain in DEFAULT_DOMAINS and opset.version < TRAINING_MODE_VERSION:
            opset.version = TRAINING_MODE_VERSION
            model.ir_version = max(model.ir_version, helper.find_min_ir_version_for([opset]))
    names = list(node.output) + ["", ""]
    outputs = [names[0]] + [names[i] or f"{names[0]}.running_{stat}" for i, stat in ((1, "mean"), (2, "var"))]
    node.output[:] = outputs
    declared = {value.name for value in model.graph.output}
    for name in outputs[1:]:
        if name not in declared:  # onnxruntime needs the running outputs declared with rank 1
            model.graph.output.append(
                helper.make_tensor_value_info(
                    name, element_type(layer.dtype), [layer.channels(layer.tensor(3, "running_mean"))]
                )
            )
    return model, outputs
