"""Running an ONNX model as the serving side of the contract: onnxruntime's CPU provider, the graph as written
unless asked otherwise (converters/models/serving/contract.py says why).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas import InputFileError

from ..model_values import InputSpec, ModelRunner
from .proto import opset_of


def input_specs(model) -> list[InputSpec]:
    """The graph inputs that are not initializers."""
    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, shape, np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name))
    return specs


def computes_in_bfloat16(model) -> bool:
    """Whether the graph has a bfloat16 input, output, initializer or intermediate value."""
    bfloat16 = onnx.TensorProto.BFLOAT16
    values = list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)
    return any(v.type.tensor_type.elem_type == bfloat16 for v in values) or any(
        t.data_type == bfloat16 for t in model.graph.initializer
    )


def _true(value: np.ndarray) -> bool:
    return bool(np.asarray(value).reshape(-1)[0])


def onnx_train_mode_nodes(model) -> list[str]:
    """BatchNormalization nodes with training_mode=1 and Dropout nodes whose training_mode input is a true constant."""
    constants = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
    found = []
    for node in model.graph.node:
        name = node.name or node.output[0]
        if node.op_type == "BatchNormalization":
            mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "training_mode"), 0)
            if mode:
                found.append(f"BatchNormalization '{name}' has training_mode=1 (normalizes with batch statistics)")
        elif (
            node.op_type == "Dropout"
            and len(node.input) > 2
            and node.input[2] in constants
            and _true(numpy_helper.to_array(constants[node.input[2]]))
        ):
            found.append(f"Dropout '{name}' has training_mode=1 (drops activations at random when run as written)")
    return found


def serving_runner(model, optimized: bool = False) -> ModelRunner:
    """Runner for an onnx.ModelProto on onnxruntime's CPU provider, as written unless `optimized`."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own Fail/InvalidGraph types
        first = str(error).strip().splitlines()[0]
        if computes_in_bfloat16(model):
            raise InputFileError(
                f"onnxruntime {onnxruntime.__version__}'s CPU provider has no bfloat16 kernels for this bfloat16 graph ({first}), so the "
                "serving contract was not run: the file's outputs were not compared with "
                "the model's. What can be done: export a float32 copy of the model (model.float() before torch.export) and "
                "run the contract on that file; or write the bfloat16 file with `normbridge export --force`, its "
                "normalizations then verified from the graph only (`normbridge contract` cannot run it)."
            ) from error
        raise InputFileError(
            f"onnxruntime cannot load the serving model ({first}); check the opset and ops it uses."
        ) from error
    names = [i.name for i in session.get_inputs()]

    def run(arrays):
        return session.run(None, dict(zip(names, arrays)))

    graph = model.graph.name or "graph"
    runtime = f"onnxruntime {onnxruntime.__version__} CPU, graph optimizations {'enabled' if optimized else 'disabled (graph as written)'}"
    return ModelRunner(
        run,
        f"onnx '{graph}' opset {opset_of(model)}, {len(model.graph.node)} nodes",
        input_specs(model),
        onnx_train_mode_nodes(model),
        [o.name for o in session.get_outputs()],
        runtime,
    )
