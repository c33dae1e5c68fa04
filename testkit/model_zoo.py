"""Small twin models, built in code, shared by the whole-model tests and the benchmarks.

Every PyTorch builder here has a Keras twin with the same layers in the same order and the
same shapes: PyTorch channels-first, Keras channels-last. Twins share layer names (a torch
path `layer1.0.bn1` is the Keras name `layer1_0_bn1`), so the weight-copy helpers pair
layers by name, while normbridge's port pairs normalization layers by order and shape; the
two agreeing is part of what the tests check. Nothing is downloaded: weights are random.

Padding: a PyTorch 3x3 convolution with padding=1 pads one row and column on each side.
Keras `padding="same"` does that for stride 1, but for stride 2 on an even input it pads
only at the bottom/right (TF's SAME rule), so stride-2 convolutions use ZeroPadding2D(1)
followed by `padding="valid"`, which matches PyTorch exactly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import torch
from torch import nn

__all__ = [
    "copy_keras_transformer_weights_to_torch",
    "copy_keras_weights_to_torch",
    "copy_torch_transformer_weights_to_keras",
    "copy_torch_weights_to_keras",
    "keras_name",
    "keras_resnet18",
    "keras_resnet_small",
    "keras_transformer_block",
    "torch_resnet18",
    "torch_resnet_small",
    "torch_transformer_block",
    "train_batchnorm_statistics",
]


def keras_name(torch_path: str) -> str:
    """The Keras layer name of a torch module path (Keras names cannot hold '.' or '/')."""
    return torch_path.replace(".", "_").replace("/", "_")


def _keras():
    from converters.keras_adapter.runtime import import_keras

    keras = import_keras()

    return keras


# -- ResNet-style CNNs ------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Conv-BN-ReLU-Conv-BN plus an identity or 1x1-Conv-BN shortcut, then ReLU (He et al., 2016)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class TorchResNet(nn.Module):
    """stem -> stages of BasicBlocks -> global average pool -> Linear."""

    def __init__(
        self, stem: nn.Sequential, stem_channels: int, widths: Sequence[int], blocks: Sequence[int], num_classes: int
    ):
        super().__init__()
        self.stem = stem
        channels = stem_channels
        for index, (width, count) in enumerate(zip(widths, blocks), start=1):
            stride = 1 if index == 1 else 2
            stage = [BasicBlock(channels, width, stride)] + [BasicBlock(width, width) for _ in range(count - 1)]
            self.add_module(f"layer{index}", nn.Sequential(*stage))
            channels = width
        self.num_stages = len(widths)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for index in range(1, self.num_stages + 1):
            x = getattr(self, f"layer{index}")(x)
        return self.fc(x.mean(dim=(2, 3)))


SMALL_WIDTHS, SMALL_BLOCKS, SMALL_STEM = (16, 32), (2, 2), 16
R18_WIDTHS, R18_BLOCKS, R18_STEM = (64, 128, 256, 512), (2, 2, 2, 2), 64


def torch_resnet_small(num_classes: int = 10) -> nn.Module:
    """A CIFAR-sized ResNet: 3x3 stem (16 channels), two stages of two BasicBlocks (16, 32), GAP, Linear."""
    torch.manual_seed(0)
    stem = nn.Sequential(nn.Conv2d(3, SMALL_STEM, 3, padding=1, bias=False), nn.BatchNorm2d(SMALL_STEM), nn.ReLU())
    return TorchResNet(stem, SMALL_STEM, SMALL_WIDTHS, SMALL_BLOCKS, num_classes)


def torch_resnet18(num_classes: int = 1000) -> nn.Module:
    """ResNet-18 as in torchvision (7x7/2 stem, 3x3/2 max pool, [2, 2, 2, 2] BasicBlocks, 64..512), written out."""
    torch.manual_seed(0)
    stem = nn.Sequential(
        nn.Conv2d(3, R18_STEM, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(R18_STEM),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
    )
    return TorchResNet(stem, R18_STEM, R18_WIDTHS, R18_BLOCKS, num_classes)


def _keras_conv(x, filters: int, kernel: int, stride: int, name: str):
    """A bias-free Conv2D that pads like PyTorch's padding=kernel//2."""
    layers = _keras().layers
    pad = kernel // 2
    if stride == 1 or pad == 0:
        return layers.Conv2D(
            filters, kernel, strides=stride, padding="same" if pad else "valid", use_bias=False, name=name
        )(x)
    x = layers.ZeroPadding2D(pad, name=name + "_pad")(x)
    return layers.Conv2D(filters, kernel, strides=stride, padding="valid", use_bias=False, name=name)(x)


def _keras_block(x, in_channels: int, out_channels: int, stride: int, prefix: str):
    """The Keras twin of BasicBlock; the main path is built before the shortcut, as PyTorch defines it."""
    layers = _keras().layers
    out = _keras_conv(x, out_channels, 3, stride, f"{prefix}_conv1")
    out = layers.BatchNormalization(name=f"{prefix}_bn1")(out)
    out = layers.ReLU(name=f"{prefix}_relu1")(out)
    out = _keras_conv(out, out_channels, 3, 1, f"{prefix}_conv2")
    out = layers.BatchNormalization(name=f"{prefix}_bn2")(out)
    shortcut = x
    if stride != 1 or in_channels != out_channels:
        shortcut = _keras_conv(x, out_channels, 1, stride, f"{prefix}_downsample_0")
        shortcut = layers.BatchNormalization(name=f"{prefix}_downsample_1")(shortcut)
    out = layers.Add(name=f"{prefix}_add")([out, shortcut])
    return layers.ReLU(name=f"{prefix}_relu2")(out)


def _keras_resnet(input_shape, stem_channels, stem_kernel, stem_stride, max_pool, widths, blocks, num_classes, name):
    keras = _keras()
    layers = keras.layers
    inputs = keras.Input(shape=tuple(input_shape), name="input")
    x = _keras_conv(inputs, stem_channels, stem_kernel, stem_stride, "stem_0")
    x = layers.BatchNormalization(name="stem_1")(x)
    x = layers.ReLU(name="stem_2")(x)
    if max_pool:
        x = layers.ZeroPadding2D(1, name="stem_3_pad")(
            x
        )  # PyTorch pads max pooling with -inf; after ReLU, 0 is the same
        x = layers.MaxPooling2D(3, strides=2, padding="valid", name="stem_3")(x)
    channels = stem_channels
    for index, (width, count) in enumerate(zip(widths, blocks), start=1):
        for block in range(count):
            stride = 2 if index > 1 and block == 0 else 1
            x = _keras_block(x, channels, width, stride, f"layer{index}_{block}")
            channels = width
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Dense(num_classes, name="fc")(x)
    return keras.Model(inputs, outputs, name=name)


def keras_resnet_small(num_classes: int = 10, input_shape: tuple[int, int, int] = (32, 32, 3)):
    """The channels-last Keras twin of torch_resnet_small, built (its BatchNormalizations keep Keras defaults)."""
    _keras().utils.set_random_seed(0)
    return _keras_resnet(input_shape, SMALL_STEM, 3, 1, False, SMALL_WIDTHS, SMALL_BLOCKS, num_classes, "resnet_small")


def keras_resnet18(num_classes: int = 1000, input_shape: tuple[int, int, int] = (224, 224, 3)):
    """The channels-last Keras twin of torch_resnet18."""
    _keras().utils.set_random_seed(0)
    return _keras_resnet(input_shape, R18_STEM, 7, 2, True, R18_WIDTHS, R18_BLOCKS, num_classes, "resnet18")


# -- weight copies (everything but the normalization layers) ---------------------------


def _weighted_torch_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {path: m for path, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}


def _keras_layer(keras_model, name: str):
    try:
        return keras_model.get_layer(name)
    except ValueError:
        raise KeyError(
            f"the Keras model has no layer '{name}', the twin of a PyTorch module; the models are not twins."
        ) from None


def _assign(variable, array: np.ndarray) -> None:
    if tuple(variable.shape) != array.shape:
        raise ValueError(
            f"variable '{variable.path}' has shape {tuple(variable.shape)}, the PyTorch weight gives {array.shape}."
        )
    variable.assign(array.astype(str(variable.dtype)))


def copy_torch_weights_to_keras(torch_model: nn.Module, keras_model) -> None:
    """Copy convolution kernels (OIHW -> HWIO) and Linear weights (out,in -> in,out) into the Keras twin.

    Normalization layers are not touched: that is what the port is for.
    """
    for path, module in _weighted_torch_modules(torch_model).items():
        layer = _keras_layer(keras_model, keras_name(path))
        weight = module.weight.detach().cpu().numpy()
        # Conv2d: OIHW (PyTorch) -> HWIO (Keras Conv2D kernel); Linear: (out, in) -> Dense kernel (in, out).
        _assign(layer.kernel, weight.transpose(2, 3, 1, 0) if weight.ndim == 4 else weight.T)
        if module.bias is not None:
            _assign(layer.bias, module.bias.detach().cpu().numpy())


def copy_keras_weights_to_torch(keras_model, torch_model: nn.Module) -> None:
    """Copy Conv2D kernels (HWIO -> OIHW) and Dense kernels (in,out -> out,in) into the PyTorch twin."""
    with torch.no_grad():
        for path, module in _weighted_torch_modules(torch_model).items():
            layer = _keras_layer(keras_model, keras_name(path))
            kernel = np.asarray(layer.kernel.numpy())
            weight = kernel.transpose(3, 2, 0, 1) if kernel.ndim == 4 else kernel.T
            module.weight.copy_(torch.from_numpy(np.ascontiguousarray(weight)))
            if module.bias is not None:
                module.bias.copy_(torch.from_numpy(np.asarray(layer.bias.numpy())))


# -- a pre-norm transformer block ----------------------------------------------------------


class TorchTransformerBlock(nn.Module):
    """x + Attention(LayerNorm(x)), then x + MLP(RMSNorm(x)); attention written out with Linear layers."""

    def __init__(self, dim: int, heads: int, layer_norm_eps: float, rms_norm_eps: float | None):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}.")
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=layer_norm_eps)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm2 = nn.RMSNorm(dim, eps=rms_norm_eps)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        batch, length, dim = t.shape
        return t.reshape(batch, length, self.heads, dim // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q, k, v = self._split(self.q(h)), self._split(self.k(h)), self._split(self.v(h))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(x.shape)
        x = x + self.o(attended)
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


def torch_transformer_block(
    dim: int = 32, heads: int = 4, *, layer_norm_eps: float = 1e-5, rms_norm_eps: float | None = None
) -> nn.Module:
    """A pre-norm transformer block with a LayerNorm (norm1) and an RMSNorm (norm2), input (batch, seq, dim)."""
    torch.manual_seed(0)
    return TorchTransformerBlock(dim, heads, layer_norm_eps, rms_norm_eps)


def keras_transformer_block(
    dim: int = 32, heads: int = 4, seq_len: int = 8, *, layer_norm_eps: float = 1e-3, rms_norm_eps: float = 1e-6
):
    """The Keras twin of torch_transformer_block (keras.layers.MultiHeadAttention computes the same attention).

    The eps defaults are Keras's own, deliberately not PyTorch's: porting must carry them.
    """
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(seq_len, dim), name="input")
    h = layers.LayerNormalization(epsilon=layer_norm_eps, name="norm1")(inputs)
    attended = layers.MultiHeadAttention(heads, dim // heads, name="attn")(h, h)
    x = layers.Add(name="add1")([inputs, attended])
    h = layers.RMSNormalization(epsilon=rms_norm_eps, name="norm2")(x)
    h = layers.Dense(4 * dim, name="fc1")(h)
    h = layers.Activation("gelu", name="act")(h)  # keras gelu is the exact (erf) GELU by default, as nn.GELU()
    h = layers.Dense(dim, name="fc2")(h)
    outputs = layers.Add(name="add2")([x, h])
    return keras.Model(inputs, outputs, name="transformer_block")


def _attention(keras_model):
    attention = keras_model.get_layer("attn")
    return {
        "q": attention.query_dense,
        "k": attention.key_dense,
        "v": attention.value_dense,
        "o": attention.output_dense,
    }


def copy_torch_transformer_weights_to_keras(torch_model: nn.Module, keras_model) -> None:
    """Copy the attention and MLP weights (not the norms) of torch_transformer_block into its Keras twin.

    MultiHeadAttention keeps q/k/v kernels as (dim, heads, head_dim) and the output kernel
    as (heads, head_dim, dim): the transposed Linear weight, reshaped.
    """
    for name, dense in _attention(keras_model).items():
        linear = getattr(torch_model, name)
        weight, bias = linear.weight.detach().numpy().T, linear.bias.detach().numpy()
        _assign(dense.kernel, weight.reshape(dense.kernel.shape))
        _assign(dense.bias, bias.reshape(dense.bias.shape))
    for name in ("fc1", "fc2"):
        linear, dense = getattr(torch_model, name), keras_model.get_layer(name)
        _assign(dense.kernel, linear.weight.detach().numpy().T)
        _assign(dense.bias, linear.bias.detach().numpy())


def copy_keras_transformer_weights_to_torch(keras_model, torch_model: nn.Module) -> None:
    """The reverse of copy_torch_transformer_weights_to_keras."""
    dim = torch_model.norm1.normalized_shape[0]
    with torch.no_grad():
        for name, dense in _attention(keras_model).items():
            linear = getattr(torch_model, name)
            linear.weight.copy_(torch.from_numpy(np.asarray(dense.kernel.numpy()).reshape(dim, dim).T.copy()))
            linear.bias.copy_(torch.from_numpy(np.asarray(dense.bias.numpy()).reshape(dim)))
        for name in ("fc1", "fc2"):
            linear, dense = getattr(torch_model, name), keras_model.get_layer(name)
            linear.weight.copy_(torch.from_numpy(np.asarray(dense.kernel.numpy()).T.copy()))
            linear.bias.copy_(torch.from_numpy(np.asarray(dense.bias.numpy())))


# -- statistics ------------------------------------------------------------------------------


def train_batchnorm_statistics(model: nn.Module, batches: Iterable[torch.Tensor]) -> nn.Module:
    """Run `model` in train mode over `batches` (no optimizer: weights stay) so running statistics move;
    return it in eval()."""
    model.train()
    with torch.no_grad():
        for batch in batches:
            model(batch)
    return model.eval()
