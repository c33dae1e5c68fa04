"""Small models whose BatchNorm statistics converged on a known input population,
for the collector's tests and benchmark.

Each model's running statistics are a cumulative average over many batches of `calm` inputs (standard normal), so
serving more `calm` inputs stays within the drift thresholds and `shifted` inputs (scaled by 2, moved by 1.5) do not.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from converters import recalibrate

SHAPE = (3, 8, 8)


def calm(rng: np.random.Generator, n: int = 4, shape=SHAPE) -> np.ndarray:
    return rng.standard_normal((n, *shape)).astype(np.float32)


def shifted(rng: np.random.Generator, n: int = 4, shape=SHAPE) -> np.ndarray:
    return (rng.standard_normal((n, *shape)) * 2.0 + 1.5).astype(np.float32)


class MonitoredCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(6, eps=1e-3)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


@torch.no_grad()
def converged(model: nn.Module, batches: int = 64, n: int = 32, seed: int = 0, shape=SHAPE) -> nn.Module:
    """Running statistics as PyTorch's cumulative average (momentum=None) over `batches` calm batches; eval mode."""
    rng = np.random.default_rng(seed)
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    for _ in range(batches):
        model(torch.from_numpy(calm(rng, n, shape)))
    for bn in bns:
        bn.momentum = 0.1
    return model.eval()


@torch.no_grad()
def unconverged_cnn(batches: int = 3, seed: int = 0) -> MonitoredCNN:
    """`batches` training forwards on calm inputs at momentum 0.1: 0.9 ** 3 = 73% of BatchNorm's initial values (mean 0,
    variance 1) stay in the running statistics, so even calm inputs look shifted against them; eval mode."""
    torch.manual_seed(seed)
    model, rng = MonitoredCNN().train(), np.random.default_rng(seed)
    for _ in range(batches):
        model(torch.from_numpy(calm(rng, 32)))
    return model.eval()


def torch_cnn(seed: int = 0) -> MonitoredCNN:
    torch.manual_seed(seed)
    return converged(MonitoredCNN(), seed=seed)


def served_window(model, inputs: np.ndarray) -> dict:
    """The window body a collector would send for `inputs` (one request): each BatchNorm input's pooled moments, read by
    the model's own adapter (converters' batchnorm_moments), with timestamps ending now."""
    from datetime import UTC, datetime, timedelta

    from converters.models.monitoring.drift import batchnorm_moments

    now = datetime.now(UTC)
    layers = []
    for moments in batchnorm_moments(model, [(inputs,)]):
        mean, var = moments.pooled()
        layers.append({"name": moments.name, "count": sum(moments.counts), "mean": mean.tolist(), "var": var.tolist()})
    return {
        "started_at": (now - timedelta(seconds=60)).isoformat(),
        "ended_at": now.isoformat(),
        "requests": len(inputs),
        "sampled": len(inputs),
        "layers": layers,
    }


def onnx_bn_model() -> onnx.ModelProto:
    """x (N,3,8,8) -> Mul 2 -> BatchNormalization (mean 0, var 4: what 2x of standard normal inputs has) -> Relu ->
    y."""
    inits = [
        numpy_helper.from_array(np.full((1, 1, 1, 1), 2.0, np.float32), "two"),
        numpy_helper.from_array(np.ones(3, np.float32), "bn.weight"),
        numpy_helper.from_array(np.zeros(3, np.float32), "bn.bias"),
        numpy_helper.from_array(np.zeros(3, np.float32), "bn.running_mean"),
        numpy_helper.from_array(np.full(3, 4.0, np.float32), "bn.running_var"),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["doubled"], name="double"),
        helper.make_node(
            "BatchNormalization",
            ["doubled", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
            ["normed"],
            name="bn",
            epsilon=1e-5,
        ),
        helper.make_node("Relu", ["normed"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "monitored",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, *SHAPE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, *SHAPE])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def keras_cnn(seed: int = 0):
    """A functional Keras CNN (channels last, 8x8x3) whose BatchNormalization statistics converged on calm inputs."""
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()  # only the Keras tests pay for TensorFlow

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", use_bias=False, name="conv")(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    x = keras.layers.ReLU()(x)
    outputs = keras.layers.Dense(2, name="head")(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs, name="monitored")
    rng = np.random.default_rng(seed)
    batches = [(calm(rng, 32, (8, 8, 3)),) for _ in range(32)]
    new, _ = recalibrate(model, batches, variance_estimator="biased")
    return new


__all__ = [
    "MonitoredCNN",
    "calm",
    "converged",
    "keras_cnn",
    "onnx_bn_model",
    "served_window",
    "shifted",
    "torch_cnn",
    "unconverged_cnn",
]
