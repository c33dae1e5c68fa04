"""The live server against its own /openapi.json: schemathesis fuzzes every operation, bounded.

A real `normbridge serve` (SQLite, local blobs) holds a model 'cnn' with two versions and an
alias; every request carries an admin token. For each operation schemathesis generates a few
requests (random path/query values, random upload bodies) and checks: no 5xx, the status code
and content type are documented, and the body matches the documented schema. A second test
sends the requests that hit real data (the pre-filled versions) so the schemas of full
responses (manifests, lineage, diffs, bundles) are checked too, not only the 404 shapes.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.http_server import create_token, running_server
from tests.registry.test_service_scale import bearer, bn_onnx_bytes, server_failures

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
#: per operation and generation mode; the whole file stays well under two minutes (raise it for a deeper hunt)
EXAMPLES = int(os.environ.get("NORMBRIDGE_FUZZ_EXAMPLES", "20"))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(server, tokens by role, cnn@1's record) of a running server pre-filled with cnn@1, cnn@2, cnn@prod and other@1.

    Tokens: "admin" (every model), "scoped" (read, only model 'cnn').
    """
    import httpx

    folder = tmp_path_factory.mktemp("schemathesis")
    db = f"sqlite:///{folder / 'registry.db'}"
    tokens = {
        "admin": create_token(db, "fuzzer", "admin"),
        "scoped": create_token(db, "viewer", "read", models=["cnn"]),
    }
    with running_server(db=db, blobs=str(folder / "blobs"), log=folder / "server.log") as server:
        with httpx.Client(headers=bearer(tokens["admin"]), timeout=300) as client:
            first = None
            for name, seed in (("cnn", 1), ("cnn", 2), ("other", 3)):
                response = client.post(
                    f"{server.url}/api/v1/models/{name}/versions",
                    params={"format": "onnx", "note": f"seed {seed}"},
                    content=bn_onnx_bytes(seed),
                    headers={"Content-Type": "application/octet-stream"},
                )
                assert response.status_code == 201, response.text
                first = first or response.json()["version"]
            assert client.put(f"{server.url}/api/v1/models/cnn/aliases/prod", json={"version": 2}).status_code == 200
        yield server, tokens, first
        assert server_failures(server.log_text()) == []


@pytest.fixture(scope="module")
def api_schema(live):
    server, _, _ = live
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def strategies(operation):
    """What to fuzz an operation with: valid requests, invalid ones, and valid ones aimed at the real models."""
    yield "positive", operation.as_strategy(GenerationMode.POSITIVE)
    yield "negative", operation.as_strategy(GenerationMode.NEGATIVE)
    if "{name}" in operation.path:
        for name in ("cnn", "other"):
            yield (
                f"positive, name={name}",
                operation.as_strategy(GenerationMode.POSITIVE, path_parameters={"name": name}),
            )


@pytest.mark.parametrize("principal", ["admin", "scoped"])
def test_every_operation_answers_as_documented(api_schema, live, principal):
    # Hypothesis strategies per operation (schemathesis' own pytest plugin does not run under pytest 9: it reads
    # request.node._nodeid); every operation runs even when an earlier one fails, and all failures are reported.
    # The scoped read token walks the 403 paths and the scope filters (models, audit, verify over its models).
    _, tokens, _ = live
    token = tokens[principal]
    failures, operations = [], 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for label, strategy in strategies(operation):

            @given(case=strategy)
            @settings(
                max_examples=EXAMPLES if principal == "admin" else max(1, EXAMPLES // 2),
                deadline=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            def fuzz(case):
                case.call_and_validate(headers=bearer(token), checks=CHECKS, timeout=120)

            try:
                fuzz()
            except Unsatisfiable:
                assert label == "negative", operation.path  # nothing invalid to send (no parameters, no body)
            except Exception as failure:  # noqa: BLE001 - collected, then reported together
                failures.append(f"{operation.method.upper()} {operation.path} ({label}): {failure}")
    assert operations >= 15
    assert failures == [], "\n\n".join(failures)


def test_responses_about_real_versions_match_the_schema(api_schema, live):
    _, tokens, first = live
    token = tokens["admin"]
    digest = next(iter(first["manifest"]["tensors"].values()))["digest"]
    requests = [
        ("/api/v1/models", "GET", {}, {}),
        ("/api/v1/models/{name}/versions", "GET", {"name": "cnn"}, {}),
        ("/api/v1/models/{name}/versions/{ref}", "GET", {"name": "cnn", "ref": "1"}, {}),
        ("/api/v1/models/{name}/versions/{ref}", "GET", {"name": "cnn", "ref": "prod"}, {}),
        ("/api/v1/models/{name}/versions/{ref}", "GET", {"name": "cnn", "ref": "latest"}, {}),
        ("/api/v1/models/{name}/versions/{ref}/lineage", "GET", {"name": "cnn", "ref": "2"}, {}),
        ("/api/v1/models/{name}/versions/{ref}/drift", "GET", {"name": "cnn", "ref": "2"}, {}),
        ("/api/v1/models/{name}/versions/{ref}/bundle", "GET", {"name": "cnn", "ref": "1"}, {}),
        ("/api/v1/models/{name}/aliases", "GET", {"name": "cnn"}, {}),
        ("/api/v1/diff", "GET", {}, {"a": "cnn@1", "b": "cnn@2"}),
        ("/api/v1/verify", "POST", {}, {"ref": "cnn@1", "check": "true"}),
        ("/api/v1/verify", "POST", {}, {}),
        ("/api/v1/audit", "GET", {}, {"verify": "true"}),
        ("/api/v1/blobs/{digest}", "GET", {"digest": digest}, {}),
        ("/api/v1/gc", "POST", {}, {"grace": 3600}),
    ]
    for path, method, path_parameters, query in requests:
        case = api_schema[path][method].Case(path_parameters=path_parameters, query=query)
        response = case.call_and_validate(headers=bearer(token), checks=CHECKS, timeout=120)
        assert response.status_code == 200, (path, path_parameters, query, response.text[:500])
    present = api_schema["/api/v1/blobs/present"]["POST"].Case(body={"digests": [digest, "0" * 64]})
    response = present.call_and_validate(headers=bearer(token), checks=CHECKS, timeout=120)
    assert response.status_code == 200 and response.json() == {"present": [digest]}
    scoped = [
        ("/api/v1/models", "GET", {}, {}, 200),
        ("/api/v1/verify", "POST", {}, {"check": "false"}, 200),
        ("/api/v1/audit", "GET", {}, {}, 200),
        ("/api/v1/models/{name}/versions", "GET", {"name": "other"}, {}, 403),
        ("/api/v1/diff", "GET", {}, {"a": "cnn@1", "b": "other@1"}, 403),
        ("/api/v1/gc", "POST", {}, {}, 403),
    ]
    for path, method, path_parameters, query, status in scoped:
        case = api_schema[path][method].Case(path_parameters=path_parameters, query=query)
        response = case.call_and_validate(headers=bearer(tokens["scoped"]), checks=CHECKS, timeout=120)
        assert response.status_code == status, (path, query, response.text[:500])
        if path == "/api/v1/models":
            assert [m["name"] for m in response.json()] == ["cnn"]
        if path == "/api/v1/verify":
            assert response.json()["passed"] is True and sorted(response.json()["versions"]) == ["cnn@1", "cnn@2"]
        if path == "/api/v1/audit":
            assert {e["model"] for e in response.json()["entries"]} == {"cnn"}
    moved = api_schema["/api/v1/models/{name}/aliases/{alias}"]["PUT"].Case(
        path_parameters={"name": "cnn", "alias": "prod"}, body={"version": "cnn@1"}, media_type="application/json"
    )
    assert moved.call_and_validate(headers=bearer(token), checks=CHECKS, timeout=120).json()["number"] == 1
    refused = api_schema["/api/v1/models/{name}/versions"]["POST"].Case(
        path_parameters={"name": "cnn"},
        query={"format": "onnx"},
        body=b"not an onnx file",
        media_type="application/octet-stream",
    )
    response = refused.call_and_validate(headers=bearer(token), checks=CHECKS, timeout=120)
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_input_file"
