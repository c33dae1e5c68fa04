"""Whether a class name says it normalizes: the name rule by which a module (or a program's module) becomes a candidate.

A candidate that its proof does not read is reported unrecognised, which refuses a registration; so a name that says
there is no norm must not make one: wav2vec2's `Wav2Vec2NoLayerNormConvLayer` (a Conv1d and a GELU), MobileBERT's
`NoNorm`. Nor does a weight reparametrization: torch's `_WeightNorm` and `_SpectralNorm`
(torch.nn.utils.parametrizations) rescale a weight, not an activation (wav2vec2's and HuBERT's `pos_conv_embed` use
weight_norm).
"""

from __future__ import annotations

import re

_NEGATED_NORM = re.compile(r"(?:No|Without)(?:[A-Z][a-z]*)?Norm")
_REPARAMETRIZATION = re.compile(r"^_?(?:Weight|Spectral)Norm$")


def names_a_norm(class_name: str) -> bool:
    """'Norm' in the class name, outside a negation such as 'NoLayerNorm' or 'WithoutNorm',
    and not a weight reparametrization."""
    return "Norm" in _NEGATED_NORM.sub("", class_name) and not _REPARAMETRIZATION.match(class_name)


def says_no_norm(class_name: str) -> bool:
    """The class name negates a norm ('NoNorm', 'NoLayerNorm'): its 1-D weight is a plain per-feature affine, put where
    a normalization would be (MobileBERT's `NoNorm`: x * weight + bias), so that weight does not make it a candidate
    either."""
    return _NEGATED_NORM.search(class_name) is not None


__all__ = ["names_a_norm", "says_no_norm"]
