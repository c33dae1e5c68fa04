"""Reading the external data of an ONNX model (model.onnx + model.onnx.data), from the model's own folder only.

`torch.onnx.export` writes the weights of a model beside it by default. Each such tensor names a
`location` relative to the model file; onnx.load would open whatever path that names. Here a
location is followed only when it stays inside the model's folder once resolved: an absolute path,
a `..` part, or a symlink that leads outside is refused, naming the tensor and the location, and
nothing outside the folder is ever opened. Offsets and lengths must lie inside the file. Every tensor the model
holds is walked, the bodies of its local functions (`model.functions`) included: onnx.checker resolves a function's
locations against the working directory, not the model's folder, so it is no guard of its own.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Iterator

import onnx

from schemas import InputFileError

#: How to embed the data instead, said in every refusal.
EMBED_HINT = "keep the data files inside the model's folder, or embed them with onnx.save(model, path, save_as_external_data=False)"


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Every tensor of the model (initializers, Constant values, subgraphs, the bodies of its functions) whose data
    lives in an external file."""
    return [tensor for tensor, _ in _external(model)]


def _external(model: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, str]]:
    """(tensor, how a message names it) for every tensor of the model kept in an external file."""
    for tensor in _graph_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            yield tensor, f"tensor '{tensor.name}'"
    for function in model.functions:
        # a function's body is nodes (Constants, If/Loop/Scan with their graphs) plus its attributes' default values
        for tensor in (*_node_tensors(function.node), *_attribute_tensors(function.attribute_proto)):
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                yield tensor, f"tensor '{tensor.name}' of function '{function.domain}.{function.name}'"


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    yield from _node_tensors(graph.node)


def _node_tensors(nodes) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        yield from _attribute_tensors(node.attribute)


def _attribute_tensors(attributes) -> Iterator[onnx.TensorProto]:
    for attribute in attributes:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        for sparse in (
            *([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []),
            *attribute.sparse_tensors,
        ):
            yield sparse.values
            yield sparse.indices
        if attribute.HasField("g"):
            yield from _graph_tensors(attribute.g)
        for subgraph in attribute.graphs:
            yield from _graph_tensors(subgraph)


def load_external_data(model: onnx.ModelProto, model_path: Path) -> None:
    """Read every external tensor of `model` (loaded from `model_path`) into memory;
    InputFileError on any unsafe location.

    Every location is checked before any file is opened, so a model with one unsafe location reads nothing."""
    folder = Path(os.path.realpath(model_path.parent))
    located = [
        (tensor, label, {entry.key: entry.value for entry in tensor.external_data})
        for tensor, label in _external(model)
    ]
    targets = [_inside(folder, fields.get("location", ""), label, model_path) for _, label, fields in located]
    for (tensor, label, fields), target in zip(located, targets):
        tensor.raw_data = _read(target, fields, label, fields.get("location", ""), model_path)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _inside(folder: Path, location: str, tensor: str, model_path: Path) -> Path:
    """The data file a location names, resolved; refused unless it is a file inside `folder`
    (`tensor`: how to name it)."""

    def refuse(why: str) -> InputFileError:
        return InputFileError(
            f"'{model_path}': {tensor} keeps its data at location '{location}', {why}; normbridge reads external data only "
            f"from the model's own folder ({EMBED_HINT})."
        )

    if not location:
        raise refuse("which names no file")
    if (
        PurePosixPath(location).is_absolute()
        or PureWindowsPath(location).is_absolute()
        or PureWindowsPath(location).drive
    ):
        raise refuse("an absolute path")
    if ".." in PurePosixPath(location.replace("\\", "/")).parts:
        raise refuse("which leads out of the folder ('..')")
    resolved = Path(os.path.realpath(folder / location))
    if resolved != folder and folder not in resolved.parents:
        raise refuse(f"which resolves to '{resolved}' outside the folder (a symlink)")
    if not resolved.is_file():
        raise refuse("which is missing beside the model (a model uploaded as one file has no data files)")
    return resolved


def _read(path: Path, fields: dict[str, str], tensor: str, location: str, model_path: Path) -> bytes:
    try:
        offset = int(fields.get("offset", 0))
        length = int(fields["length"]) if "length" in fields else None
    except ValueError:
        raise InputFileError(
            f"'{model_path}': {tensor} gives a non-integer offset or length for '{location}'; re-export the model."
        ) from None
    size = path.stat().st_size
    if offset < 0 or (length is not None and length < 0) or offset + (length or 0) > size:
        raise InputFileError(
            f"'{model_path}': {tensor} reads bytes {offset}..{offset + (length or 0)} of '{location}', which has {size}; "
            "the data file does not belong to this model (re-export it)."
        )
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read() if length is None else handle.read(length)


def onnx_upload_bytes(path: Path) -> bytes | None:
    """The bytes to send a registry server for the .onnx file at `path`: None when the file is self-contained (it is
    sent as it is), else the model with its external data read from its own folder (load_external_data: inside it only)
    and embedded, since a server receives one file. InputFileError when the embedded model would pass protobuf's 2 GB
    limit."""
    try:
        model = onnx.load_from_string(Path(path).read_bytes())
    except Exception:  # noqa: BLE001 - an unreadable file is refused by the server with its own message
        return None
    if not external_tensors(model):
        return None
    load_external_data(model, Path(path))
    try:
        return model.SerializeToString()
    except ValueError as error:  # protobuf refuses a message over 2 GB
        raise InputFileError(
            f"'{path}' keeps its tensors in external data files and, embedded, is over protobuf's 2 GB limit, while a registry server "
            "receives the model as one file; register it without --server, which reads the data files from the model's folder."
        ) from error
