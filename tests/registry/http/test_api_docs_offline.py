"""/docs and /redoc of a real `normbridge serve` render in Chromium with nothing fetched from outside this machine.

Every request the pages make is recorded; any to a host other than the server's loopback address
is aborted (as it would fail without internet access) and fails the test. Swagger UI must list the
API's operations and ReDoc must render their summaries, from the files normbridge serves itself.
The request guard still applies to those files: another Host is refused.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from tests.http_server import running_server
from tests.registry.web.test_web import CHROMIUM, CHROMIUM_ARGS

from playwright import sync_api as playwright_api  # a test dependency: missing it must fail, not skip

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api_docs")
    with running_server(
        db=f"sqlite:///{folder / 'registry.db'}", blobs=str(folder / "blobs"), log=folder / "serve.log"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def offline_page(browser, server):
    """A page that records every request and aborts those leaving the server's host; returns
    (context, page, requested URLs)."""
    host = urlsplit(server.url).hostname
    requested: list[str] = []
    context = browser.new_context(viewport={"width": 1200, "height": 900})

    def route(request_route, request) -> None:
        requested.append(request.url)
        if urlsplit(request.url).hostname == host:
            request_route.continue_()
        else:
            request_route.abort("internetdisconnected")

    context.route("**/*", route)
    return context, context.new_page(), requested


def foreign(requested: list[str], server) -> list[str]:
    host = urlsplit(server.url).hostname
    return [url for url in requested if urlsplit(url).scheme not in ("data", "blob") and urlsplit(url).hostname != host]


def test_swagger_ui_lists_the_operations_offline(server, browser):
    context, page, requested = offline_page(browser, server)
    try:
        page.goto(server.url + "/docs")
        page.wait_for_selector(".opblock", timeout=30_000)
        paths = page.locator(".opblock-summary-path").all_inner_texts()
        assert "/api/v1/models" in [p.replace("\u200b", "") for p in paths], paths
        assert page.locator(".opblock").count() >= 10
    finally:
        context.close()
    assert requested and not foreign(requested, server), foreign(requested, server)
    assert any(url.endswith("/static/api-docs/swagger-ui-bundle.js") for url in requested)


def test_redoc_renders_the_operations_offline(server, browser):
    context, page, requested = offline_page(browser, server)
    try:
        page.goto(server.url + "/redoc")
        page.locator("h2", has_text="Liveness (no token needed)").first.wait_for(
            timeout=30_000
        )  # the operation's section
        assert page.locator("h1").first.inner_text().startswith("normbridge registry")
    finally:
        context.close()
    assert requested and not foreign(requested, server), foreign(requested, server)
    assert any(url.endswith("/static/api-docs/redoc.standalone.js") for url in requested)


def test_the_docs_pages_may_load_only_from_this_server(server):
    for path in ("/docs", "/redoc"):
        policy = httpx.get(server.url + path, timeout=30).headers["content-security-policy"]
        assert "default-src 'self'" in policy and "img-src 'self' data:" in policy and "https:" not in policy


def test_the_request_guard_covers_the_docs_assets(server):
    asset = f"{server.url}/static/api-docs/swagger-ui-bundle.js"
    assert httpx.get(asset, timeout=30).status_code == 200
    refused = httpx.get(asset, headers={"Host": "attacker.example"}, timeout=30)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "untrusted_request"
    assert refused.headers["x-content-type-options"] == "nosniff"
