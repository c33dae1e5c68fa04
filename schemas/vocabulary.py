"""The closed vocabularies of the spec: kinds, layouts, conventions, dtypes, frameworks."""

from __future__ import annotations

from typing import Literal

#: The normalizer kinds normbridge understands.
Kind = Literal["batch", "layer", "rms", "group", "instance"]
KINDS: tuple[str, ...] = ("batch", "layer", "rms", "group", "instance")

#: Kinds whose statistics are per channel (they have a channel axis and a layout).
CHANNEL_KINDS: tuple[str, ...] = ("batch", "group", "instance")
#: Kinds normalising over trailing axes (they have a normalized_shape).
TRAILING_KINDS: tuple[str, ...] = ("layer", "rms")

#: Which axis holds the channels in the layer's own framework.
Layout = Literal["channels_first", "channels_last"]

#: How a momentum value is meant.
#: `batch_weight`: running = (1 - m) * running + m * batch   (PyTorch)
#: `running_weight`: running = m * running + (1 - m) * batch (Keras, ONNX)
MomentumConvention = Literal["batch_weight", "running_weight"]

#: Which batch-variance estimator updates the running variance.
#: PyTorch uses the unbiased one (n - 1); Keras 3 and ONNX the biased one (n).
VarianceEstimator = Literal["unbiased", "biased"]

#: Where the eps value came from: written explicitly, or PyTorch RMSNorm's `eps=None`
#: (meaning the eps of the dtype torch computes in, floats.dtype_default_eps, which we store as its number too).
EpsOrigin = Literal["explicit", "dtype_eps"]

Framework = Literal["torch", "keras", "onnx", "spec"]
FRAMEWORKS: tuple[str, ...] = ("torch", "keras", "onnx")

DType = Literal["bfloat16", "float16", "float32", "float64"]
DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32", "float64")

#: Names of the state tensors a spec may carry.
TENSOR_NAMES: tuple[str, ...] = ("scale", "bias", "running_mean", "running_var", "num_batches_tracked")

