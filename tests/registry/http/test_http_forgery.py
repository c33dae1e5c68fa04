"""Requests a web page could forge against a local server: cross-site POSTs, DNS rebinding,
form bodies on JSON endpoints.

A real `normbridge serve --insecure-local` on loopback (where every anonymous request is the admin
'local') is attacked with httpx exactly as a browser would send the forged request: a text/plain
"simple" POST with `Origin: https://evil.example`, a Referer-only POST, `Host: evil.example` (what a
browser sends after evil.example was rebound to 127.0.0.1), form-encoded and multipart bodies. What
the server stored is read back with the registry library on the same database, so "nothing
registered, gc not run, nothing audited" is checked where it lives. The legitimate paths (same
origin, the CLI client, scripts without Origin) must keep working, and a token server applies the
same Host and Origin rules.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.cli_process import normbridge_command
from tests.http_server import create_token, free_port, running_server
from testkit.processes import stop_process_group, wait_for_http
from tests.registry.http.test_http_api import assert_error, bearer, onnx_bytes, snapshot

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

EVIL = "https://evil.example"
FORM_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x")


def refusal(response: httpx.Response, header: str, value: str) -> dict:
    """The guard's 403: code untrusted_request, the header in `setting`, the value received in the message."""
    error = assert_error(response, 403, "untrusted_request")
    assert error["setting"] == header and value in error["message"], error
    assert response.headers["x-content-type-options"] == "nosniff"
    return error


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    from registry.service import Registry

    root = tmp_path_factory.mktemp("forgery")
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    with running_server(db=db, blobs=blobs, args=["--insecure-local"], log=root / "serve.log") as server:
        registry = Registry(db=db, blobs=blobs, user="test")
        with httpx.Client(base_url=server.url, timeout=180) as same_origin:
            created = same_origin.post(
                "/api/v1/models/bn/versions",
                params={"format": "onnx"},
                content=onnx_bytes(),
                headers={"Content-Type": "application/octet-stream"},
            )
            assert created.status_code == 201, created.text
        yield {"server": server, "registry": registry, "root": root, "db": db, "blobs": blobs}
        registry.meta.close()


def state(registry) -> dict:
    """Versions, blobs and the audit log: what a refused request must leave as it was."""
    return {**snapshot(registry), "audit": [(e.seq, e.action) for e in registry.audit()]}


def test_cross_site_simple_posts_neither_register_nor_collect_garbage(local):
    url, registry = local["server"].url, local["registry"]
    orphan = registry.store.put(b"an unreferenced blob gc would delete " + os.urandom(8))
    before = state(registry)
    forged = {"Content-Type": "text/plain", "Origin": EVIL}
    refusal(
        httpx.post(
            f"{url}/api/v1/models/evil/versions",
            params={"format": "onnx"},
            content=onnx_bytes(),
            headers=forged,
            timeout=60,
        ),
        "Origin",
        EVIL,
    )
    refusal(
        httpx.post(f"{url}/api/v1/gc", params={"grace": 0}, content=b"x", headers=forged, timeout=60), "Origin", EVIL
    )
    refusal(httpx.post(f"{url}/api/v1/gc", params={"grace": 0}, headers={"Origin": EVIL}, timeout=60), "Origin", EVIL)
    # the body a <form enctype="text/plain"> sends, and the JSON endpoints
    refusal(
        httpx.put(f"{url}/api/v1/models/bn/aliases/prod", content=b'{"version": 1}', headers=forged, timeout=60),
        "Origin",
        EVIL,
    )
    refusal(httpx.post(f"{url}/api/v1/verify", headers=forged, timeout=60), "Origin", EVIL)
    assert state(registry) == before and registry.store.exists(orphan)


def test_other_origins_of_the_same_machine_and_opaque_origins_are_refused(local):
    url, registry = local["server"].url, local["registry"]
    before = state(registry)
    port = url.rsplit(":", 1)[1]
    for origin in (
        "null",
        "http://127.0.0.1:1",
        "http://localhost.evil.example:" + port,
        "http://127.0.0.1",
        "file://",
        f"http://127.0.0.1:{port}@evil.example",
        f"http://127.0.0.1:{port}/",
    ):
        refusal(
            httpx.post(f"{url}/api/v1/gc", params={"grace": 0}, headers={"Origin": origin}, timeout=60),
            "Origin",
            origin,
        )
    # no Origin (an older browser's form post): the Referer decides; a browser's own Sec-Fetch-Site too
    refusal(
        httpx.post(f"{url}/api/v1/gc", params={"grace": 0}, headers={"Referer": f"{EVIL}/page.html"}, timeout=60),
        "Referer",
        f"{EVIL}/page.html",
    )
    refusal(
        httpx.post(f"{url}/api/v1/gc", params={"grace": 0}, headers={"Sec-Fetch-Site": "cross-site"}, timeout=60),
        "Sec-Fetch-Site",
        "cross-site",
    )
    refusal(
        httpx.post(f"{url}/api/v1/gc", params={"grace": 0}, headers={"Sec-Fetch-Site": "same-site"}, timeout=60),
        "Sec-Fetch-Site",
        "same-site",
    )
    assert state(registry) == before


def test_a_rebound_host_name_is_refused_on_the_pages_and_the_api(local):
    url, registry = local["server"].url, local["registry"]
    port = url.rsplit(":", 1)[1]
    before = state(registry)
    for host in (
        "evil.example",
        f"evil.example:{port}",
        f"127.0.0.1.evil.example:{port}",
        "localhost.evil.example",
        "[::2]",
    ):
        for path in (
            "/ui/",
            "/ui/models/bn",
            "/api/v1/models",
            "/api/v1/models/bn/versions/1",
            "/api/v1/health",
            "/openapi.json",
        ):
            response = httpx.get(url + path, headers={"Host": host, "Accept": "text/html"}, timeout=60)
            refusal(response, "Host", host)
            assert "bn@1" not in response.text
        refusal(
            httpx.post(
                f"{url}/api/v1/gc", params={"grace": 0}, headers={"Host": host, "Origin": f"http://{host}"}, timeout=60
            ),
            "Host",
            host,
        )
    assert state(registry) == before


def test_form_bodies_never_reach_a_json_or_upload_endpoint(local):
    url, registry = local["server"].url, local["registry"]
    before = state(registry)
    for content_type in FORM_TYPES:
        for method, path, params in (
            ("POST", "/api/v1/models/bn/versions", {"format": "onnx"}),
            ("POST", "/api/v1/gc", {"grace": 0}),
            ("POST", "/api/v1/verify", {}),
            ("POST", "/api/v1/blobs/present", {}),
            ("PUT", "/api/v1/models/bn/aliases/prod", {}),
        ):
            for origin in ({"Origin": url}, {}):  # same origin, and a client that sends no Origin
                response = httpx.request(
                    method,
                    url + path,
                    params=params,
                    content=b'{"version": 1, "digests": []}',
                    headers={"Content-Type": content_type, **origin},
                    timeout=60,
                )
                error = assert_error(response, 415, "unsupported_media_type")
                assert error["setting"] == "Content-Type" and content_type in error["message"], error
    # a JSON endpoint takes JSON only; an upload takes raw bytes only
    for content_type in ("application/octet-stream", "application/xml"):
        response = httpx.put(
            f"{url}/api/v1/models/bn/aliases/prod",
            content=b'{"version": 1}',
            headers={"Content-Type": content_type},
            timeout=60,
        )
        assert_error(response, 415, "unsupported_media_type")
    response = httpx.post(
        f"{url}/api/v1/models/bn/versions",
        params={"format": "onnx"},
        content=onnx_bytes(),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert_error(response, 415, "unsupported_media_type")
    assert state(registry) == before


def test_same_origin_requests_and_the_cli_client_still_work(local, tmp_path):
    url, registry = local["server"].url, local["registry"]
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "localhost", "LOCALHOST:" + port):
        assert httpx.get(f"{url}/api/v1/models", headers={"Host": host}, timeout=60).status_code == 200, host
        page = httpx.get(f"{url}/ui/models/bn", headers={"Host": host, "Accept": "text/html"}, timeout=60)
        assert page.status_code == 200 and "bn@1" in page.text, host
    moved = httpx.put(f"{url}/api/v1/models/bn/aliases/prod", json={"version": 1}, headers={"Origin": url}, timeout=60)
    assert moved.status_code == 200, moved.text
    via_localhost = httpx.put(
        f"{url}/api/v1/models/bn/aliases/prod",
        json={"version": 1},
        headers={"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"},
        timeout=60,
    )
    assert via_localhost.status_code == 200, via_localhost.text
    referer_only = httpx.post(
        f"{url}/api/v1/verify", params={"check": "false"}, headers={"Referer": f"{url}/ui/"}, timeout=60
    )
    assert referer_only.status_code == 200, referer_only.text
    user_typed = httpx.post(
        f"{url}/api/v1/verify", params={"check": "false"}, headers={"Sec-Fetch-Site": "same-origin"}, timeout=60
    )
    assert user_typed.status_code == 200, user_typed.text
    tarball = httpx.get(f"{url}/api/v1/models/bn/versions/1/bundle", timeout=60).content
    imported = httpx.post(
        f"{url}/api/v1/models/bn-copy/versions",
        params={"format": "bundle"},
        content=tarball,
        headers={"Content-Type": "application/x-tar"},
        timeout=180,
    )
    assert imported.status_code == 201, imported.text

    # the CLI client: no token, no Origin, no Referer; uploads as application/octet-stream, JSON as application/json
    model = tmp_path / "bn.onnx"
    model.write_bytes(onnx_bytes())
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NORMBRIDGE_")}
    for args in (
        ["register", "cli-bn", str(model)],
        ["alias", "cli-bn", "prod", "cli-bn@1"],
        ["gc", "--grace", "0"],
        ["verify", "--no-check"],
    ):
        done = subprocess.run(
            [*normbridge_command(), "--server", url, *args],
            capture_output=True,
            text=True,
            timeout=240,
            env=environment,
        )
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    assert registry.show("cli-bn@prod").number == 1
    assert ("gc", "local") in [(e.action, e.user) for e in registry.audit()]


def test_a_token_server_applies_the_same_host_and_origin_rules(tmp_path):
    db, blobs = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "blobs")
    admin = bearer(create_token(db, "root", "admin"))
    with running_server(db=db, blobs=blobs, log=tmp_path / "serve.log") as server:
        url = server.url
        refusal(
            httpx.get(f"{url}/api/v1/models", headers={**admin, "Host": "evil.example"}, timeout=60),
            "Host",
            "evil.example",
        )
        refusal(
            httpx.get(f"{url}/ui/", headers={"Host": "evil.example", "Accept": "text/html"}, timeout=60),
            "Host",
            "evil.example",
        )
        refusal(
            httpx.post(f"{url}/api/v1/gc", params={"grace": 0}, headers={**admin, "Origin": EVIL}, timeout=60),
            "Origin",
            EVIL,
        )
        assert_error(
            httpx.post(
                f"{url}/api/v1/gc", params={"grace": 0}, headers={**admin, "Content-Type": "text/plain"}, timeout=60
            ),
            415,
            "unsupported_media_type",
        )
        assert httpx.post(f"{url}/api/v1/gc", params={"grace": 0}, headers=admin, timeout=60).status_code == 200
        # the login form: cross-site is refused by the guard before the page's own CSRF check
        refusal(
            httpx.post(f"{url}/ui/login", data={"token": "x"}, headers={"Origin": EVIL}, timeout=60), "Origin", EVIL
        )


def serve_process(tmp_path: Path, host: str, *args: str, env: dict | None = None):
    """`normbridge serve --host HOST` on a free port (not necessarily loopback); (process, port, log)."""
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    command = [
        *normbridge_command(),
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        "--db",
        f"sqlite:///{tmp_path / 'r.db'}",
        "--blobs",
        str(tmp_path / "blobs"),
        *args,
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
    wait_for_http(
        f"http://127.0.0.1:{port}/api/v1/health",
        process,
        90,
        lambda: log.read_text(errors="replace"),
        "normbridge serve",
    )
    return process, port, log


@pytest.mark.parametrize("workers", ["1", "2"])
def test_allowed_host_names_a_proxy_or_dns_name_for_single_and_multi_worker_servers(tmp_path, workers):
    process, port, _ = serve_process(
        tmp_path,
        "127.0.0.1",
        "--insecure-local",
        "--allowed-host",
        "registry.example.test",
        "--allowed-host",
        "nb.internal:8443",
        "--workers",
        workers,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for host in (
            "registry.example.test",
            f"registry.example.test:{port}",
            "nb.internal:8443",
            "Registry.Example.Test",
        ):
            assert httpx.get(f"{url}/api/v1/models", headers={"Host": host}, timeout=60).status_code == 200, host
        posted = httpx.post(
            f"{url}/api/v1/verify",
            params={"check": "false"},
            headers={"Host": "registry.example.test", "Origin": "https://registry.example.test"},
            timeout=60,
        )
        assert posted.status_code == 200, posted.text
        refusal(httpx.get(f"{url}/api/v1/models", headers={"Host": "evil.example"}, timeout=60), "Host", "evil.example")
        refusal(
            httpx.get(f"{url}/api/v1/models", headers={"Host": "nb.internal:9999"}, timeout=60),
            "Host",
            "nb.internal:9999",
        )
        refusal(
            httpx.post(
                f"{url}/api/v1/verify",
                headers={"Host": "registry.example.test", "Origin": "https://evil.example"},
                timeout=60,
            ),
            "Origin",
            "https://evil.example",
        )
    finally:
        stop_process_group(process)


def test_a_wildcard_bind_accepts_ip_literals_and_allowed_names_only(tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    token = bearer(create_token(db, "root", "read"))
    process, port, _ = serve_process(tmp_path, "0.0.0.0", "--allowed-host", "registry.example.test")
    url = f"http://127.0.0.1:{port}"
    try:
        for host in (
            f"127.0.0.1:{port}",
            f"10.1.2.3:{port}",
            f"[::1]:{port}",
            f"localhost:{port}",
            "registry.example.test",
        ):
            assert httpx.get(f"{url}/api/v1/models", headers={**token, "Host": host}, timeout=60).status_code == 200, (
                host
            )
        for host in ("evil.example", f"myhost.lan:{port}", "0x7f.1"):
            refusal(httpx.get(f"{url}/api/v1/models", headers={**token, "Host": host}, timeout=60), "Host", host)
    finally:
        stop_process_group(process)


def test_a_bad_allowed_host_is_refused_before_the_server_starts(tmp_path):
    for value in ("http://registry.example.test", "evil.example/path", "*"):
        done = subprocess.run(
            [
                *normbridge_command(),
                "serve",
                "--port",
                "1",
                "--allowed-host",
                value,
                "--db",
                f"sqlite:///{tmp_path / 'x.db'}",
                "--blobs",
                str(tmp_path / "xb"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and "--allowed-host" in done.stderr and value in done.stderr, done.stderr
    assert not (tmp_path / "x.db").exists()


def test_multipart_and_urlencoded_forms_from_the_same_page_are_refused_too(local):
    """A same-origin page can still post a form (an HTML injection would do it): the API takes no form bodies at all."""
    url = local["server"].url
    files = {"file": ("bn.onnx", io.BytesIO(onnx_bytes()), "application/octet-stream")}
    response = httpx.post(
        f"{url}/api/v1/models/form/versions",
        params={"format": "onnx"},
        files=files,
        headers={"Origin": url},
        timeout=60,
    )
    assert_error(response, 415, "unsupported_media_type")
    response = httpx.post(
        f"{url}/api/v1/gc", params={"grace": 0}, data={"grace": "0"}, headers={"Origin": url}, timeout=60
    )
    assert_error(response, 415, "unsupported_media_type")
    assert "form" not in [name for name, _, _ in local["registry"].models()]
