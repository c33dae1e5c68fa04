"""ONNX files with external data: read from the model's own folder, never from a path outside it."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from converters.models.inspection import inspect_path
from converters.models.loading import load_model
from converters.onnx_adapter.external_data import external_tensors
from schemas import InputFileError

torch = pytest.importorskip("torch")


def _external_model(folder, location="model.onnx.data", size=64):
    """A LayerNormalization model whose scale lives in an external file (written by onnx.save)."""
    scale = np.random.default_rng(0).uniform(0.5, 2.0, size).astype(np.float32)
    node = helper.make_node("LayerNormalization", ["X", "scale"], ["Y"], axis=-1, epsilon=1e-5, name="ln")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", size])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", size])],
        initializer=[numpy_helper.from_array(scale, "scale")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0
    )
    return path, scale


def _relocate(path, location):
    """Rewrite the model's external data location to `location` (what a crafted file would say)."""
    model = onnx.load(path, load_external_data=False)
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    path.write_bytes(model.SerializeToString())


def test_torch_onnx_export_default_external_data_is_read(tmp_path):
    """torch.onnx.export writes model.onnx + model.onnx.data by default; both are read and the norm is found."""
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64, eps=1e-4)).eval()
    with torch.no_grad():
        net[1].weight.uniform_(0.5, 2.0)
    path = tmp_path / "model.onnx"
    torch.onnx.export(net, (torch.randn(2, 64),), str(path), dynamo=True, opset_version=23, verbose=False)
    assert (tmp_path / "model.onnx.data").is_file(), "torch.onnx.export no longer writes external data by default"
    model = load_model(path)
    assert not external_tensors(model)
    report = inspect_path(path)
    norms = [layer for layer in report.layers if layer.kind == "layer"]
    assert len(norms) == 1 and norms[0].eps == 1e-4
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert any(np.array_equal(w, net[1].weight.detach().numpy()) for w in weights.values())


def test_external_data_beside_the_model_is_read_bit_exactly(tmp_path):
    (tmp_path / "weights").mkdir()
    path, scale = _external_model(tmp_path, location="weights/scale.bin")
    model = load_model(path)
    (tensor,) = model.graph.initializer
    np.testing.assert_array_equal(numpy_helper.to_array(tensor), scale)


@pytest.mark.parametrize("kind", ["parent", "absolute", "symlink", "missing", "empty"])
def test_locations_outside_the_folder_are_refused(tmp_path, kind):
    inside = tmp_path / "model"
    inside.mkdir()
    path, _ = _external_model(inside)
    outside = tmp_path / "secret.bin"
    outside.write_bytes((inside / "model.onnx.data").read_bytes())
    location = {
        "parent": "../secret.bin",
        "absolute": str(outside),
        "symlink": "link.data",
        "missing": "gone.data",
        "empty": "",
    }[kind]
    if kind == "symlink":
        os.symlink(outside, inside / "link.data")
    _relocate(path, location)
    with pytest.raises(InputFileError) as error:
        load_model(path)
    assert error.value.code == "bad_input_file"
    message = str(error.value)
    assert "tensor 'scale'" in message and f"location '{location}'" in message and str(path) in message


def test_a_symlink_inside_the_folder_is_followed(tmp_path):
    path, scale = _external_model(tmp_path)
    os.rename(tmp_path / "model.onnx.data", tmp_path / "real.data")
    os.symlink(tmp_path / "real.data", tmp_path / "alias.data")
    _relocate(path, "alias.data")
    np.testing.assert_array_equal(numpy_helper.to_array(load_model(path).graph.initializer[0]), scale)


def test_offsets_past_the_end_are_refused(tmp_path):
    path, _ = _external_model(tmp_path)
    model = onnx.load(path, load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "offset":
            entry.value = "4096"
    if not any(e.key == "offset" for e in model.graph.initializer[0].external_data):
        model.graph.initializer[0].external_data.add(key="offset", value="4096")
    path.write_bytes(model.SerializeToString())
    with pytest.raises(InputFileError, match="tensor 'scale' reads bytes 4096"):
        load_model(path)


@pytest.mark.slow
def test_a_registry_server_upload_embeds_the_external_data_from_the_models_own_folder(tmp_path):
    """The server receives one file: the client used to refuse such a model (so `--server mlflow import` of a default
    mlflow.onnx.log_model model failed); it now sends the model with its data embedded,
    read from the model's folder only."""
    from registry.client import RemoteRegistry
    from tests.http_server import create_token, running_server

    path, scale = _external_model(tmp_path)
    db, blobs = f"sqlite:///{tmp_path / 'r.db'}", str(tmp_path / "blobs")
    token = create_token(db, "uploader", "write")
    with running_server(db=db, blobs=blobs, log=tmp_path / "serve.log") as server:
        client = RemoteRegistry(server.url, token=token)
        assert client.register("m", path).created
        pulled = client.pull("m@1", tmp_path / "back.onnx")
    back = onnx.load(pulled.path)
    assert not external_tensors(back)
    [stored] = [numpy_helper.to_array(t) for t in back.graph.initializer if t.name == "scale"]
    assert np.array_equal(stored, scale)
    _relocate(path, "../outside.data")  # an unsafe location is still refused before anything is sent
    with pytest.raises(InputFileError, match="outside"):
        RemoteRegistry("http://127.0.0.1:9").register("m", path)


def test_a_server_side_load_without_the_data_file_names_it(tmp_path):
    """What the server sees when such a file reaches it anyway (an old client): a refusal naming tensor and location."""
    path, _ = _external_model(tmp_path)
    os.remove(tmp_path / "model.onnx.data")
    with pytest.raises(
        InputFileError, match="tensor 'scale' keeps its data at location 'model.onnx.data', which is missing"
    ):
        load_model(path)


# -- local functions (model.functions): the same location checks (issue 30) -------------------------------------------

IN_ACCESS, IN_OPEN = 0x1, 0x20


class OpenWatch:
    """Whether a file was opened or read since the watch began (inotify on the file itself, Linux):
    stat alone is no open."""

    def __init__(self, path):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0 and libc.inotify_add_watch(self.fd, os.fsencode(path), IN_OPEN | IN_ACCESS) >= 0

    def opened(self) -> bool:
        try:
            return bool(os.read(self.fd, 4096))
        except BlockingIOError:
            return False
        finally:
            os.close(self.fd)


def _external_constant(location: str, size: int) -> onnx.TensorProto:
    tensor = onnx.TensorProto(
        name="k", data_type=onnx.TensorProto.FLOAT, dims=[size], data_location=onnx.TensorProto.EXTERNAL
    )
    for key, value in (("location", location), ("offset", "0"), ("length", str(4 * size))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def _function_model(folder, location, where="constant", size=8):
    """A LayerNormalization, then a call of the local function custom.AddK whose body adds a constant kept in an
    external file at `location`: the value of a Constant in the body, of a Constant in an If branch inside it, or the
    default of the function's attribute that its Constant takes (what a crafted file would hold)."""
    scale = np.linspace(0.5, 2.0, size).astype(np.float32)
    k = _external_constant(location, size)
    if where == "constant":
        body = [helper.make_node("Constant", [], ["kv"], value=k, name="const")]
        defaults = []
    elif where == "if branch":
        then = helper.make_graph(
            [helper.make_node("Constant", [], ["t"], value=k)],
            "then",
            [],
            [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [size])],
        )
        other = helper.make_graph(
            [helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(np.zeros(size, np.float32)))],
            "else",
            [],
            [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [size])],
        )
        body = [
            helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
            helper.make_node("If", ["c"], ["kv"], then_branch=then, else_branch=other),
        ]
        defaults = []
    else:  # "attribute default"
        body = [helper.make_node("Constant", [], ["kv"])]
        body[0].attribute.add(name="value", ref_attr_name="kval", type=onnx.AttributeProto.TENSOR)
        defaults = [helper.make_attribute("kval", k)]
    function = helper.make_function(
        "custom",
        "AddK",
        ["x"],
        ["y"],
        [*body, helper.make_node("Add", ["x", "kv"], ["y"])],
        [helper.make_opsetid("", 17)],
        attribute_protos=defaults,
    )
    graph = helper.make_graph(
        [
            helper.make_node("LayerNormalization", ["X", "scale"], ["h"], axis=-1, epsilon=1e-5, name="ln"),
            helper.make_node("AddK", ["h"], ["Y"], domain="custom", name="call"),
        ],
        "g",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, ["N", size])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["N", size])],
        initializer=[numpy_helper.from_array(scale, "scale")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)], functions=[function]
    )
    model.ir_version = 8
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    return folder / "model.onnx"


@pytest.mark.parametrize("where", ["constant", "if branch", "attribute default"])
@pytest.mark.parametrize("kind", ["parent", "etc passwd", "absolute", "symlink", "working directory"])
def test_a_function_body_tensor_outside_the_folder_is_refused_and_never_opened(tmp_path, monkeypatch, kind, where):
    """Before, the walker saw only model.graph: onnx.checker refused some of these with its own words, and a location
    that is missing beside the model but present in the working directory (the checker resolves it there) was loaded and
    registered."""
    inside = tmp_path / "model"
    inside.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(8, dtype=np.float32).tobytes())
    location = {
        "parent": "../secret.bin",
        "etc passwd": "../../etc/passwd",
        "absolute": str(secret),
        "symlink": "link.data",
        "working directory": "secret.bin",
    }[kind]
    if kind == "symlink":
        os.symlink(secret, inside / "link.data")
    monkeypatch.chdir(tmp_path)  # where 'secret.bin' is, beside the model's folder
    path = _function_model(inside, location, where)
    watch = OpenWatch(secret)
    with pytest.raises(InputFileError) as error:
        load_model(path)
    assert not watch.opened(), f"{secret} was opened"
    message = str(error.value)
    assert f"'{path}': tensor 'k' of function 'custom.AddK' keeps its data at location '{location}'" in message, message
    assert "reads external data only from the model's own folder" in message


def test_a_function_body_tensor_inside_the_folder_is_read_into_the_model(tmp_path):
    data = np.linspace(-1.0, 1.0, 8).astype(np.float32)
    (tmp_path / "k.bin").write_bytes(data.tobytes())
    watch = OpenWatch(tmp_path / "k.bin")
    model = load_model(_function_model(tmp_path, "k.bin"))
    assert watch.opened()  # the control: the watch sees the read of a file inside the folder
    assert not external_tensors(model)
    [constant] = [node for node in model.functions[0].node if node.op_type == "Constant"]
    np.testing.assert_array_equal(numpy_helper.to_array(constant.attribute[0].t), data)


@pytest.mark.slow  # a registration
def test_a_model_whose_function_reads_a_file_of_the_working_directory_is_not_registered(tmp_path, monkeypatch):
    """The attack that got through: registered as m@1 before, its function pointing at a file outside the model's
    folder."""
    from registry.service import Registry

    (tmp_path / "model").mkdir()
    (tmp_path / "secret.bin").write_bytes(np.arange(8, dtype=np.float32).tobytes())
    monkeypatch.chdir(tmp_path)
    path = _function_model(tmp_path / "model", "secret.bin")
    registry = Registry(db=f"sqlite:///{tmp_path / 'r.db'}", blobs=str(tmp_path / "blobs"))
    with pytest.raises(
        InputFileError,
        match="tensor 'k' of function 'custom.AddK' keeps its data at location 'secret.bin', which is missing",
    ):
        registry.register("m", path)
    assert registry.models() == [] and list(registry.store.digests()) == []
    registry.meta.close()
