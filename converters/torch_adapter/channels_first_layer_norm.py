"""A LayerNorm over the channel axis of a channels-first input: what a layer spec with layout="channels_first" computes.

PyTorch's LayerNorm normalises trailing axes only. A Keras LayerNormalization(axis=1), ConvNeXt's and timm's
LayerNorm2d normalise axis 1 alone; transformers' ConvNextLayerNorm(data_format="channels_first") does it by moving the
channels last, normalising, and moving them back, and so does this module, for inputs of any rank >= 2.
"""

from __future__ import annotations

import torch


class ChannelsFirstLayerNorm(torch.nn.LayerNorm):
    """nn.LayerNorm((C,)) applied to axis 1: input.movedim(1, -1), LayerNorm, movedim(-1, 1)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - torch's own argument name
        return super().forward(input.movedim(1, -1)).movedim(-1, 1)
