"""Short labels for long layer names that stay as distinct as the names.

A chart has room for about 28 characters per layer name; cutting every name to its tail made
'features.1.block.2.squeeze_excitation.fc1.bn' and 'features.2.block.2.squeeze_excitation.fc1.bn'
print alike. Here a long name keeps a head and a tail around a middle ellipsis, the same split for
every name, with the shortest head that keeps all labels distinct (the distinguishing part of
dotted paths is usually near the start or the end); when no split does, the names are kept whole.
"""

from __future__ import annotations

from collections.abc import Sequence

ELLIPSIS = "…"


def _shorten(name: str, width: int, head: int) -> str:
    return name if len(name) <= width else name[:head] + ELLIPSIS + name[len(name) - (width - 1 - head) :]


def _split_labels(names: list[str], width: int, wanted: int) -> list[str] | None:
    if all(len(name) <= width for name in names):
        return names
    for head in range(0, width - 1):
        labels = [_shorten(name, width, head) for name in names]
        if len(set(labels)) == wanted:
            return labels
    return None


def _abbreviated(name: str, count: int) -> str:
    """`name` with its first `count` dotted parts (never the last) cut to their first character; numbers stay whole."""
    parts = name.split(".")
    last = len(parts) - 1
    return ".".join(part if i >= count or i == last or part.isdigit() else part[:1] for i, part in enumerate(parts))


def distinct_labels(names: Sequence[str], width: int = 28) -> list[str]:
    """One label per name, each at most `width` characters, distinct whenever the names are (else the whole names).

    When no head-and-tail split keeps transformers paths apart (`resnet.encoder.stages.0.layers.1.layer.2.normalization`
    differs from its siblings in the middle), the leading dotted parts are cut to their initials first, one more at a
    time (`r.e.s.0.l.1.l.2.normalization`), and the split is tried again.
    """
    names = list(names)
    wanted = len(set(names))
    depth = max((name.count(".") for name in names), default=0)
    for count in range(0, depth + 1):
        labels = _split_labels([_abbreviated(name, count) for name in names], width, wanted)
        if labels is not None:
            return labels
    return names


__all__ = ["distinct_labels"]
