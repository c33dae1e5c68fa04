"""GET /api/v1/models/{name}/versions/{ref}/model over a real `normbridge serve`: streamed, digest in a header,
scope honoured.

The versions are registered in-process on the server's own database and blob folder; requests go over TCP.
"""

from __future__ import annotations

import hashlib

import httpx
import numpy as np
import pytest
import torch

from registry.client import RemoteRegistry
from schemas.errors import ForbiddenError
from tests.http_server import create_token, running_server
from tests.registry.http.test_http_api import assert_error, bearer
from tests.registry.test_pull import SAMPLE, onnx_run, trained_cnn

pytestmark = pytest.mark.slow  # starts a server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from registry.service import Registry

    root = tmp_path_factory.mktemp("http-model")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    registry = Registry(db=db, blobs=blobs, user="test")
    onnx_file, pt2_file = root / "cnn.onnx", root / "cnn.pt2"
    model = trained_cnn()
    torch.onnx.export(
        model,
        (torch.from_numpy(SAMPLE),),
        str(onnx_file),
        dynamo=False,
        do_constant_folding=False,
        training=torch.onnx.TrainingMode.EVAL,
    )
    torch.export.save(torch.export.export(model, (torch.from_numpy(SAMPLE),)), str(pt2_file))
    registry.register("cnn", onnx_file)
    registry.register("other", pt2_file)
    tokens = {"cnn": create_token(db, "cnn-team", "read", models=["cnn"]), "all": create_token(db, "ops", "read")}
    with running_server(db=db, blobs=blobs, log=root / "serve.log") as server:
        yield {"url": server.url, "tokens": tokens, "onnx": onnx_file, "model": model, "root": root}


def test_the_model_is_streamed_with_its_digest_and_is_the_registered_file(served):
    response = httpx.get(
        f"{served['url']}/api/v1/models/cnn/versions/1/model", headers=bearer(served["tokens"]["cnn"]), timeout=120
    )
    assert response.status_code == 200, response.text
    assert response.content == served["onnx"].read_bytes()
    assert response.headers["X-Normbridge-Digest"] == hashlib.sha256(response.content).hexdigest()
    assert response.headers["X-Normbridge-Version"] == "cnn@1" and response.headers["X-Normbridge-Format"] == "onnx"
    assert 'filename="cnn-1.onnx"' in response.headers["Content-Disposition"]


def test_a_scoped_token_is_refused_outside_its_models_whether_or_not_they_exist(served):
    headers = bearer(served["tokens"]["cnn"])
    for name in ("other", "missing"):
        assert_error(
            httpx.get(f"{served['url']}/api/v1/models/{name}/versions/1/model", headers=headers, timeout=60),
            403,
            "forbidden",
        )
    assert_error(httpx.get(f"{served['url']}/api/v1/models/cnn/versions/1/model"), 401, "unauthorized")
    with RemoteRegistry(served["url"], served["tokens"]["cnn"]) as remote, pytest.raises(ForbiddenError):
        remote.pull("other@1", served["root"] / "refused.pt2")
    assert not (served["root"] / "refused.pt2").exists()


def test_the_client_pulls_and_loads_over_http(served, tmp_path):
    with RemoteRegistry(served["url"], served["tokens"]["all"]) as remote:
        result = remote.pull("cnn@1", tmp_path / "cnn.onnx")
        assert (tmp_path / "cnn.onnx").read_bytes() == served["onnx"].read_bytes() and result.digest == hashlib.sha256(
            served["onnx"].read_bytes()
        ).hexdigest()
        program = remote.load("other@1")
        remote.pull("other", tmp_path / "sd.safetensors", "safetensors")
    with torch.no_grad():
        assert np.array_equal(
            program.module()(torch.from_numpy(SAMPLE)).numpy(), served["model"](torch.from_numpy(SAMPLE)).numpy()
        )
    assert np.array_equal(onnx_run(tmp_path / "cnn.onnx"), onnx_run(served["onnx"]))
    from safetensors.torch import load_file

    trained_cnn(seed=7).load_state_dict(load_file(tmp_path / "sd.safetensors"), strict=True)


def test_an_unknown_format_is_a_422_naming_the_formats(served):
    response = httpx.get(
        f"{served['url']}/api/v1/models/cnn/versions/1/model",
        params={"format": "pickle"},
        headers=bearer(served["tokens"]["all"]),
        timeout=60,
    )
    assert response.status_code in (400, 422) and "safetensors" in response.text
