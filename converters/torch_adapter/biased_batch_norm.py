"""BatchNorm modules that update running_var with the biased batch variance (Keras 3 / ONNX).

PyTorch's kernel updates running_var with the unbiased variance (n - 1); Keras 3 and
ONNX use the biased one (n). When a layer converted from Keras or ONNX must keep
training exactly as it did there, `match_variance_estimator=True` emits these.
Normalisation itself is unchanged (both frameworks normalise with the biased variance).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _BiasedRunningVariance:
    """Mixin: the training step of PyTorch BatchNorm, with the biased estimator for running_var."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's own argument name
        if not (self.training and self.track_running_stats):
            return super().forward(input)
        self._check_input_dim(input)
        output = F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            weight = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            dims = [0] + list(range(2, input.dim()))
            mean = input.mean(dim=dims)
            var = input.var(dim=dims, unbiased=False)
            self.running_mean.mul_(1.0 - weight).add_(mean.to(self.running_mean.dtype) * weight)
            self.running_var.mul_(1.0 - weight).add_(var.to(self.running_var.dtype) * weight)
        return output


class BiasedBatchNorm1d(_BiasedRunningVariance, torch.nn.BatchNorm1d):
    """BatchNorm1d whose running_var follows the biased estimator."""


class BiasedBatchNorm2d(_BiasedRunningVariance, torch.nn.BatchNorm2d):
    """BatchNorm2d whose running_var follows the biased estimator."""


class BiasedBatchNorm3d(_BiasedRunningVariance, torch.nn.BatchNorm3d):
    """BatchNorm3d whose running_var follows the biased estimator."""


BIASED_CLASSES = (BiasedBatchNorm1d, BiasedBatchNorm2d, BiasedBatchNorm3d)
_BY_BASE = {
    torch.nn.BatchNorm1d: BiasedBatchNorm1d,
    torch.nn.BatchNorm2d: BiasedBatchNorm2d,
    torch.nn.BatchNorm3d: BiasedBatchNorm3d,
}


def biased_class_for(cls: type) -> type:
    """The biased-estimator twin of a BatchNorm class."""
    return _BY_BASE[cls]
