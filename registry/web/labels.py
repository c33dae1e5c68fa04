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
    return name if len(name) <= width else name[:head] + ELLIPSIS + name[len(name) - (width - 1 - head):]


def distinct_labels(names: Sequence[str], width: int = 28) -> list[str]:
    """One label per name, each at most `width` characters, distinct whenever the names are (else the whole names)."""
    names = list(names)
    if all(len(name) <= width for name in names):
        return names
    wanted = len(set(names))
    for head in range(0, width - 1):
        labels = [_shorten(name, width, head) for name in names]
        if len(set(labels)) == wanted:
            return labels
    return names


__all__ = ["distinct_labels"]
