"""Bodies a caller without a token (or with one) sends to a real `normbridge serve`: refused before they are held.

Issue 30, hole 1: FastAPI reads the body of a route with a body parameter before any dependency (token, 415, 413)
runs, and the request guard bounded only application/json bodies, so an anonymous 512 MiB octet-stream POST to
.../drift, a PUT .../aliases/x without a Content-Type and a form posted to /ui/login were each held whole by the
server (+1 GiB of resident memory per 512 MiB) before it answered 415 or 401. Here each is sent for real over a socket
(tests/raw_http.py: declared with Content-Length, and chunked, several at once), and the server's peak resident memory
is read from /proc/<pid>/status (VmHWM, reset through /proc/<pid>/clear_refs first).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.http_server import create_token, running_server
from tests.raw_http import stream_body
from tests.registry.test_bundle_bomb import memory

pytestmark = pytest.mark.slow  # starts a server

BODY = 128 << 20  # each attacking body; before the fix each added twice its size to the server
ANONYMOUS_GROWTH = 48 << 20  # what three refused anonymous bodies together may add to the server's peak memory
#: An authenticated body is read up to the API's 32 MiB bound before the route refuses it, and parsed once read.
AUTHENTICATED_GROWTH = 96 << 20
DRIFT = "/api/v1/models/x/versions/1/drift"
ALIAS = "/api/v1/models/x/aliases/x"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("bodies")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    token = create_token(db, "writer", "write")
    with running_server(db=db, blobs=blobs, log=root / "serve.log") as running:
        auth = {"Authorization": f"Bearer {token}"}
        for chunked in (False, True):  # warm up every path measured below with small bodies
            stream_body(running.url, "POST", DRIFT, {"Content-Type": "application/octet-stream"}, 1024, chunked=chunked)
            stream_body(running.url, "PUT", ALIAS, auth, 1024, chunked=chunked)
            stream_body(
                running.url,
                "POST",
                "/ui/login",
                {"Content-Type": "application/x-www-form-urlencoded"},
                1024,
                chunked=chunked,
            )
        yield running, auth


def peak_growth(pid: int, attack) -> tuple[int, object]:
    """(bytes the server's peak resident memory rose by while `attack()` ran, what it returned)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS now
    before = memory(pid, "VmRSS")
    result = attack()
    return memory(pid, "VmHWM") - before, result


def error_of(answer) -> dict:
    return json.loads(answer.body)["error"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_anonymous_bodies_get_401_before_they_are_read(server, chunked):
    running, _ = server
    attacks = [
        ("POST", DRIFT, {"Content-Type": "application/octet-stream"}),  # the curl
        ("PUT", ALIAS, {}),  # no Content-Type at all
        ("POST", DRIFT, {"Content-Type": "application/json"}),
    ]

    def attack():
        with ThreadPoolExecutor(len(attacks)) as pool:  # concurrent bodies used to add up
            return list(pool.map(lambda a: stream_body(running.url, a[0], a[1], a[2], BODY, chunked=chunked), attacks))

    growth, answers = peak_growth(running.process.pid, attack)
    assert growth < ANONYMOUS_GROWTH, (
        f"three anonymous {BODY >> 20} MiB bodies raised the server's peak memory by {growth >> 20} MiB"
    )
    for (method, path, _), answer in zip(attacks, answers):
        assert answer.status == 401 and error_of(answer)["code"] == "unauthorized", (
            method,
            path,
            answer.status,
            answer.body[:300],
        )


def test_an_anonymous_request_gets_401_before_its_content_type_is_judged(server):
    running, _ = server
    for content_type in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/octet-stream",
        "application/xml",
    ):
        for method, path in (
            ("POST", DRIFT),
            ("PUT", ALIAS),
            ("POST", "/api/v1/blobs/present"),
            ("POST", "/api/v1/gc"),
        ):
            answer = httpx.request(
                method, running.url + path, content=b"{}", headers={"Content-Type": content_type}, timeout=60
            )
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized", (
                method,
                path,
                content_type,
                answer.text,
            )
    forged = httpx.post(
        running.url + DRIFT,
        content=b"{}",
        headers={"Content-Type": "application/json", "Authorization": "Bearer nbt_x_y"},
        timeout=60,
    )
    assert forged.status_code == 401, forged.text  # a made-up token is no token


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_login_form_body_is_cut_at_its_bound(server, chunked):
    running, _ = server

    def attack():
        return stream_body(
            running.url,
            "POST",
            "/ui/login",
            {"Content-Type": "application/x-www-form-urlencoded"},
            BODY,
            chunked=chunked,
        )

    growth, answer = peak_growth(running.process.pid, attack)
    assert growth < ANONYMOUS_GROWTH, (
        f"a {BODY >> 20} MiB login form raised the server's peak memory by {growth >> 20} MiB"
    )
    assert answer.status == 413 and error_of(answer)["code"] == "payload_too_large", (answer.status, answer.body[:300])
    assert "8192" in error_of(answer)["message"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_authenticated_body_of_any_media_type_is_bounded(server, chunked):
    running, auth = server
    attacks = [("PUT", ALIAS, auth), ("POST", DRIFT, {**auth, "Content-Type": "application/octet-stream"})]

    def attack():
        return [
            stream_body(running.url, method, path, headers, 2 * BODY, chunked=chunked)
            for method, path, headers in attacks
        ]

    growth, (unlabelled, octets) = peak_growth(running.process.pid, attack)
    assert growth < AUTHENTICATED_GROWTH, (
        f"a {2 * BODY >> 20} MiB body raised the server's peak memory by {growth >> 20} MiB"
    )
    assert unlabelled.status == 413 and error_of(unlabelled)["code"] == "payload_too_large", (
        unlabelled.status,
        unlabelled.body[:300],
    )
    assert str(32 << 20) in error_of(unlabelled)["message"]
    # a JSON endpoint takes JSON: refused for its media type before a byte of it is read
    assert octets.status == 415 and error_of(octets)["code"] == "unsupported_media_type", (
        octets.status,
        octets.body[:300],
    )
    assert octets.sent < 2 * BODY


def test_a_real_login_form_and_json_bodies_still_pass(server):
    running, auth = server
    token = auth["Authorization"].removeprefix("Bearer ")
    with httpx.Client(base_url=running.url, timeout=60) as browser:
        page = browser.get("/ui/login", headers={"Accept": "text/html"})
        csrf = browser.cookies["nb_csrf"]
        assert page.status_code == 200 and csrf in page.text
        answer = browser.post(
            "/ui/login", data={"token": token, "csrf": csrf, "next": "/ui/"}, headers={"Origin": running.url}
        )
        assert (
            answer.status_code == 303
            and answer.headers["location"] == "/ui/"
            and browser.cookies.get("nb_session") == token
        )
    chunked = httpx.post(
        running.url + "/api/v1/blobs/present",
        content=iter([b'{"digests"', b": []}"]),
        headers={**auth, "Content-Type": "application/json"},
        timeout=60,
    )
    assert chunked.status_code == 200 and chunked.json() == {"present": []}, chunked.text
