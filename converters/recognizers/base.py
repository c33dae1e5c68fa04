"""What a recognizer is: something that tells a normalization apart from everything else in a framework's objects.

Two families, because frameworks show normalizations two ways:

- an `ObjectRecognizer` is shown one object (a torch module, a Keras layer, an op of a
  torch.export graph, an ONNX node) and says which kind it is, or None when it does not know it;
- a `GraphRecognizer` is shown a whole ONNX graph (`GraphIndex`) and finds the normalizations
  spelled as several nodes, claiming the nodes it reports so later recognizers skip them.

Each framework lists its stock recognizers in `<framework>_adapter/recognizers/__init__.py`, in the order they are asked
(`converters/recognizers/__init__.py` asks them).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar


class Recognizer(abc.ABC):
    """One way of recognising normalizations; `name` is unique in the registry."""

    name: ClassVar[str]
    framework: ClassVar[str]


class ObjectRecognizer(Recognizer):
    """Tells the kind of one framework object."""

    @abc.abstractmethod
    def kind_of(self, obj: Any) -> str | None:
        """The kind of `obj`; None when this recognizer does not know it (the next one is asked).

        Raises UnsupportedObjectError for an object it knows to be a normalization that cannot be
        converted (say, a torch SyncBatchNorm), so no later recognizer guesses at it.
        """


class GraphRecognizer(Recognizer):
    """Finds normalizations in an ONNX graph."""

    @abc.abstractmethod
    def find(self, index: Any, claimed: set[int]) -> list:
        """The matches (onnx_adapter.graph.match.Match) in `index` that use no node in `claimed`;
        adds their nodes to it."""
