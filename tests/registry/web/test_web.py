"""The web pages end to end: a real `normbridge serve`, a real headless Chromium, a registry filled by the library.

The registry holds a small CNN registered (cnn@1), fine-tuned on its running statistics only (cnn@2, parent cnn@1),
recalibrated from cnn@1 (cnn@3) and fine-tuned again (cnn@4), a second model only a scoped token may see (other@2
converted from cnn@1), and a recorded drift check of cnn@1. Chromium logs in with a token, walks from the models page to
a version, to its lineage graph and through the graph to the parent, opens a diff and reads the headline and the plot,
the drift chart and the audit log; every page is screenshotted to test-artifacts/screenshots/ (the lineage and diff ones
also to docs/screenshots/ for docs/web.md, when missing or with NORMBRIDGE_UPDATE_SCREENSHOTS=1). Plain HTTP requests
check what a browser cannot show: refusals without a session, the cookie's flags, and the CSRF checks of the login form.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from converters.models.monitoring.drift import drift_check
from registry.drift_records import record_drift
from schemas.serving import DriftThresholds
from tests.cli_process import normbridge_command
from tests.http_server import create_token, running_server
from tests.registry.test_registry_service import finetune_statistics, trained_cnn

from playwright import sync_api as playwright_api  # a test dependency: missing it must fail, not skip

pytestmark = pytest.mark.slow  # every test here starts a server or a subprocess (`make test-fast` skips them)

ROOT = Path(__file__).resolve().parents[3]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EVIL_NOTE = "<script>document.title='pwned'</script><b>bold?</b>"
EVIL_OWNER = "<img src=x onerror=alert(1)>"
PAGES = [
    "/ui/",
    "/ui/models/cnn",
    "/ui/models/cnn/versions/1",
    "/ui/models/cnn/versions/1/lineage",
    "/ui/diff?a=cnn@1&b=cnn@2",
    "/ui/models/cnn/versions/1/drift",
    "/ui/audit?model=cnn",
]


class Site:
    """The running server, its registry and the tokens the tests log in with."""

    def __init__(self, server, registry, tokens: dict[str, str], drift_report, db: str):
        self.server, self.registry, self.tokens, self.drift_report, self.db = server, registry, tokens, drift_report, db

    @property
    def url(self) -> str:
        return self.server.url


def tiny_norm_model() -> torch.nn.Module:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    with torch.no_grad():
        model.train()
        for _ in range(2):
            model(torch.randn(16, 4))
    return model.eval()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from registry.service import Registry

    folder = tmp_path_factory.mktemp("web")
    db, blobs = f"sqlite:///{folder / 'registry.db'}", str(folder / "blobs")
    registry = Registry(db=db, blobs=blobs, user="alice")
    model = trained_cnn()
    registry.register("cnn", model, note="3 SGD steps")
    finetune_statistics(model)
    registry.register("cnn", model, note="stats-only fine-tune")
    finetune_statistics(model, seed=2)
    registry.as_user("bob").register("cnn", model, parent="cnn@1", operation="recalibrated", note="new camera")
    finetune_statistics(model, seed=3)
    registry.register("cnn", model, parent="cnn@3", operation="fine-tuned", note="camera B data")
    registry.set_alias("cnn", "production", "cnn@2")
    tiny = tiny_norm_model()
    registry.register("other", tiny, note=EVIL_NOTE)
    with torch.no_grad():
        tiny.train()(torch.randn(16, 4) + 1.0)
    registry.register(
        "other", tiny.eval(), parent="cnn@1", operation="converted", note="head only"
    )  # lineage across models
    inputs = (np.random.default_rng(0).standard_normal((32, 3, 8, 8)) * 2.0 + 1.0).astype(np.float32)
    report = drift_check(trained_cnn(), inputs, DriftThresholds(shift=0.5))
    record_drift(registry.as_user("carol"), "cnn@1", report)
    tokens = {
        "reader": create_token(db, "reader", "read"),
        "scoped": create_token(db, "scoped", "read", models=["other"]),
        "evil": create_token(db, EVIL_OWNER, "read"),
    }
    with running_server(db=db, blobs=blobs, log=folder / "serve.log") as server:
        yield Site(server, registry, tokens, report, db)
    registry.meta.close()


@pytest.fixture(scope="module")
def browser():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def login(browser, site: Site, who: str = "reader", start: str = "/ui/"):
    """A new browser context logged in through the real form; returns (context, page) on `start`."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    page = context.new_page()
    page.goto(site.url + start)
    assert "/ui/login" in page.url
    page.fill("#token", site.tokens[who])
    page.click("button[type=submit]")
    page.wait_for_load_state()
    return context, page


def shot(page, name: str) -> Path:
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 5000
    return path


def readme_copy(png: Path, name: str) -> None:
    """The screenshots of docs/web.md: refreshed when missing or when NORMBRIDGE_UPDATE_SCREENSHOTS=1
    (timestamps change every run)."""
    target = DOCS_SCREENSHOTS / name
    if target.exists() and os.environ.get("NORMBRIDGE_UPDATE_SCREENSHOTS") != "1":
        return
    DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, target)


def no_token_anywhere(page, site: Site) -> None:
    html = page.content()
    for token in site.tokens.values():
        assert token not in html
        assert token.split("_", 2)[2] not in html  # nbt_<id>_<secret>; the secret itself may contain "_"


# -- refusals -------------------------------------------------------------------------------------------


def test_pages_refuse_without_a_valid_session(site, browser):
    with httpx.Client(base_url=site.url, follow_redirects=False) as client:
        for path in PAGES:
            browser_like = client.get(path, headers={"Accept": "text/html,application/xhtml+xml"})
            assert browser_like.status_code == 303, path
            assert browser_like.headers["location"].startswith("/ui/login?next=")
            script = client.get(path)
            assert script.status_code == 401 and script.json()["error"]["code"] == "unauthorized", path
            assert "nbt_" not in script.text
            forged = client.get(
                path, headers={"Accept": "text/html"}, cookies={"nb_session": "nbt_000000000000_" + "A" * 43}
            )
            assert forged.status_code == 303, path
        # a bearer token is the API's way in, not the pages': the cookie is the only session
        bearer = client.get("/ui/", headers={"Authorization": f"Bearer {site.tokens['reader']}"})
        assert bearer.status_code == 401

    context = browser.new_context()
    page = context.new_page()
    page.goto(site.url + "/ui/models/cnn/versions/1")
    assert "/ui/login" in page.url and page.locator("#token").is_visible()
    assert page.locator("text=cnn@1").count() == 0  # nothing of the registry before login
    shot(page, "login")
    context.close()


def test_login_form_refuses_other_origins_and_missing_csrf_tokens(site):
    with httpx.Client(base_url=site.url, follow_redirects=False) as client:
        form_page = client.get("/ui/login")
        csrf = client.cookies["nb_csrf"]
        assert re.search(r'name="csrf" value="([^"]+)"', form_page.text).group(1) == csrf
        good = {"token": site.tokens["reader"], "csrf": csrf, "next": "/ui/models/cnn"}
        same_site = {"Origin": site.url, "Content-Type": "application/x-www-form-urlencoded"}

        cross = client.post("/ui/login", data=good, headers={**same_site, "Origin": "http://evil.example"})
        assert cross.status_code == 403 and "nb_session" not in cross.headers.get("set-cookie", "")
        no_origin = client.post("/ui/login", data=good, headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert no_origin.status_code == 403
        bad_referer = client.post(
            "/ui/login",
            data=good,
            headers={"Referer": "http://evil.example/ui/login", "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert bad_referer.status_code == 403
        no_csrf = client.post("/ui/login", data={**good, "csrf": "guessed"}, headers=same_site)
        assert no_csrf.status_code == 403 and "nb_session" not in no_csrf.headers.get("set-cookie", "")
        wrong_token = client.post(
            "/ui/login", data={**good, "token": "nbt_000000000000_" + "B" * 43}, headers=same_site
        )
        assert wrong_token.status_code == 401 and "nb_session" not in wrong_token.headers.get("set-cookie", "")
        offsite_next = client.post("/ui/login", data={**good, "next": "//evil.example/"}, headers=same_site)
        assert offsite_next.status_code == 303 and offsite_next.headers["location"] == "/ui/"  # never an open redirect

        client.cookies.clear()  # that login worked (and replaced the CSRF secret): start again from the form
        client.get("/ui/login")
        good["csrf"] = client.cookies["nb_csrf"]
        ok = client.post(
            "/ui/login",
            data=good,
            headers={"Referer": site.url + "/ui/login", "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert ok.status_code == 303 and ok.headers["location"] == "/ui/models/cnn"
        cookie = next(c for c in ok.headers.get_list("set-cookie") if c.startswith("nb_session="))
        flags = {part.strip().lower() for part in cookie.split(";")}
        assert "httponly" in flags and "samesite=strict" in flags and "path=/" in flags
        assert "secure" not in flags  # plain http on loopback; https responses add Secure
        page = client.get("/ui/models/cnn", headers={"Accept": "text/html"})
        assert page.status_code == 200 and site.tokens["reader"] not in page.text
        assert (
            "script-src" not in page.headers["content-security-policy"]
            and "default-src 'none'" in page.headers["content-security-policy"]
        )

        logout_cross = client.post(
            "/ui/logout",
            data={"csrf": client.cookies["nb_csrf"]},
            headers={**same_site, "Origin": "http://evil.example"},
        )
        assert logout_cross.status_code == 403


def test_login_browse_and_logout_in_chromium(site, browser):
    context, page = login(browser, site, start="/ui/models/cnn")
    assert page.url.endswith("/ui/models/cnn")  # back where the login started
    cookies = {c["name"]: c for c in context.cookies()}
    session = cookies["nb_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict" and not session["secure"]
    assert page.evaluate("document.cookie").find("nb_session") == -1  # invisible to page scripts
    no_token_anywhere(page, site)
    page.click("header button[type=submit]")  # log out
    page.wait_for_load_state()
    assert "/ui/login" in page.url
    assert "nb_session" not in {c["name"] for c in context.cookies()}
    page.goto(site.url + "/ui/models/cnn")
    assert "/ui/login" in page.url
    context.close()


def test_a_revoked_token_ends_the_session(site, browser):
    token = create_token(site.db, "temp", "read")
    context = browser.new_context()
    page = context.new_page()
    page.goto(site.url + "/ui/login")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_load_state()
    assert page.locator("h1").inner_text() == "Models"
    token_id = token.split("_")[1]
    done = subprocess.run(
        [*normbridge_command(), "token", "revoke", token_id, "--db", site.db],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    page.goto(site.url + "/ui/")
    assert "/ui/login" in page.url
    context.close()


# -- the pages ----------------------------------------------------------------------------------------


def test_models_page_to_version_to_parent_through_the_lineage_graph(site, browser):
    context, page = login(browser, site)
    assert [s.get_attribute("data-model") for s in page.locator("section.model").all()] == ["cnn", "other"]
    row = page.locator("tr[data-ref='cnn@2']")
    assert row.locator(".badge").all_inner_texts() == ["production"]
    assert page.locator("tr[data-ref='cnn@4'] .badge").all_inner_texts() == ["latest"]
    assert row.locator(".verdict").inner_text() == "passed"
    # the note is shown as text, never as markup
    assert page.locator("tr[data-ref='other@1'] td").nth(8).inner_text() == EVIL_NOTE
    assert page.evaluate("document.scripts.length") == 0 and page.title() != "pwned"
    shot(page, "models")

    page.click("a.version-link:text-is('cnn@3')")
    page.wait_for_load_state()
    assert page.url.endswith("/ui/models/cnn/versions/3")
    layers = page.locator("table.layers tbody tr")
    assert layers.count() == 2
    bn1, bn2 = layers.nth(0).locator("td"), layers.nth(1).locator("td")
    assert bn1.nth(0).inner_text() == "bn1" and bn1.nth(2).inner_text() == "float32"  # the dtype column (issue 35 §3)
    assert bn1.nth(3).inner_text() == "1e-05" and bn1.nth(4).inner_text() == "0.1 (batch_weight)"
    assert (
        bn2.nth(3).inner_text() == "0.001"
        and bn2.nth(4).inner_text() == "0.01 (batch_weight)"
        and bn1.nth(5).inner_text() == "eval"
    )
    assert "eps_not_default" in bn2.nth(9).inner_text() and bn1.nth(9).inner_text() == "none"
    stats = site.registry.tensors("cnn@3")
    mean = stats["bn1.running_mean"].astype(np.float64)
    assert bn1.nth(6).inner_text() == f"{mean.min():.4g} / {mean.mean():.4g} / {mean.max():.4g}"
    pairs = page.locator("table.equivalence tbody tr td:nth-child(2)").all_inner_texts()
    assert sorted(set(pairs)) == ["torch → keras", "torch → onnx", "torch → torch"] and len(pairs) == 6
    stored = site.registry.show("cnn@3").manifest["equivalence"][0]["outputs"]
    keras_row = page.locator("table.equivalence tbody tr").nth([o["framework"] for o in stored].index("keras"))
    assert (
        keras_row.locator("td").nth(2).inner_text()
        == f"{next(o for o in stored if o['framework'] == 'keras')['max_abs_error']:.3e}"
    )
    shot(page, "version")

    page.click("#lineage-link")
    page.wait_for_load_state()
    assert page.url.endswith("/ui/models/cnn/versions/3/lineage")
    graph = page.locator("#lineage-graph svg")
    assert graph.is_visible() and graph.bounding_box()["height"] > 50
    assert page.locator("#lineage-graph a.node").evaluate_all("nodes => nodes.map(n => n.dataset.ref)") == [
        "cnn@1",
        "cnn@3",
        "cnn@4",
    ]
    assert page.locator("#lineage-graph text.edge-label").all_text_contents() == ["recalibrated", "fine-tuned"]
    lineage_png = shot(page, "lineage-cnn@3")
    page.click("#lineage-graph a.node[data-ref='cnn@1']")
    page.wait_for_load_state()
    assert page.url.endswith("/ui/models/cnn/versions/1")
    assert page.locator("h1").inner_text().startswith("cnn@1")

    page.click("#lineage-link")  # the root's graph: every child, of this model and of another, with its operation
    page.wait_for_load_state()
    assert sorted(page.locator("#lineage-graph text.edge-label").all_text_contents()) == [
        "converted",
        "fine-tuned",
        "fine-tuned",
        "recalibrated",
    ]
    assert page.locator("#lineage-graph a.node").evaluate_all("nodes => nodes.map(n => n.dataset.ref)") == [
        "cnn@1",
        "cnn@2",
        "cnn@3",
        "cnn@4",
        "other@2",
    ]
    lineage_png = shot(page, "lineage")
    readme_copy(lineage_png, "lineage.png")
    no_token_anywhere(page, site)
    context.close()


def test_diff_page_shows_the_headline_and_plots_every_channel(site, browser):
    context, page = login(browser, site, start="/ui/models/cnn/versions/2")
    page.click("#diff-parent-link")
    page.wait_for_load_state()
    assert "/ui/diff?" in page.url
    assert page.locator("#headline").inner_text() == "weights identical, running statistics changed in 2 layers"
    plot = page.locator("#movement-plot svg.movement-plot")
    assert plot.is_visible()
    box = plot.bounding_box()
    assert box["width"] > 300 and box["height"] > 100
    assert plot.locator("g.movement-layer").evaluate_all("gs => gs.map(g => g.dataset.layer)") == ["bn1", "bn2"]
    bars = plot.locator("g.movement-layer[data-layer='bn1'] rect.bar")
    assert bars.count() == 2 * 4  # mean and variance bar per channel of bn1 (4 channels)
    # the plotted values are the real movement of the running statistics, channel by channel
    a, b = site.registry.tensors("cnn@1"), site.registry.tensors("cnn@2")
    eps = 1e-5
    shift = (b["bn1.running_mean"].astype(np.float64) - a["bn1.running_mean"]) / np.sqrt(
        a["bn1.running_var"].astype(np.float64) + eps
    )
    titles = bars.locator("title").all_text_contents()[:4]
    for channel, title in enumerate(titles):
        assert title.startswith(f"channel {channel}: ")
        assert math.isclose(float(title.split(": ")[1]), shift[channel], rel_tol=1e-3, abs_tol=1e-9)
    assert max(bars.nth(i).bounding_box()["height"] for i in range(4)) > 5  # drawn, not zero-height
    tensor_rows = page.locator("table.tensors tr.tensor-changed td:first-child").all_inner_texts()
    assert set(tensor_rows) == {
        f"{layer}.{name}" for layer in ("bn1", "bn2") for name in ("running_mean", "running_var", "num_batches_tracked")
    }
    diff_png = shot(page, "diff")
    readme_copy(diff_png, "diff.png")

    page.goto(site.url + "/ui/diff?a=cnn@2&b=cnn@2")
    assert page.locator("#headline").inner_text() == "identical content" and page.locator("#no-movement").is_visible()
    page.goto(site.url + "/ui/diff?a=cnn@1&b=cnn@99")
    assert page.locator("h1").inner_text() == "Not found" and "cnn@99" in page.locator(".error-box").inner_text()
    context.close()


def test_drift_page_charts_each_layer_against_the_threshold(site, browser):
    context, page = login(browser, site, start="/ui/models/cnn/versions/1")
    page.click("#drift-link")
    page.wait_for_load_state()
    report = site.drift_report
    assert page.locator("#drift-verdict").inner_text().startswith(report.verdict.upper())
    chart = page.locator("#drift-shift-chart svg.threshold-chart")
    assert chart.is_visible()
    rows = chart.locator("g.bar-row")
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.layer)") == [layer.name for layer in report.layers]
    over = chart.locator("g.bar-row.over").evaluate_all("rs => rs.map(r => r.dataset.layer)")
    assert over == [layer.name for layer in report.layers if layer.max_shift > report.thresholds.shift]
    threshold = chart.locator("line.threshold")
    assert f"threshold {report.thresholds.shift:g}" in chart.text_content()
    # bars are to scale: a bar's end lies left of the threshold line exactly when it is under the threshold
    line_x = threshold.bounding_box()["x"]
    for i, layer in enumerate(report.layers):
        end = rows.nth(i).locator("rect.bar").first.bounding_box()
        assert (end["x"] + end["width"] > line_x) == (layer.max_shift > report.thresholds.shift)
    shot(page, "drift")
    page.goto(site.url + "/ui/models/cnn/versions/2/drift")
    assert page.locator("#no-drift").is_visible()
    context.close()


def test_audit_log_filters_by_model_and_user_and_escapes_everything(site, browser):
    context, page = login(browser, site, who="evil", start="/ui/audit")
    assert page.locator("header .who").inner_text().startswith(EVIL_OWNER)  # the owner name is text, not an image
    assert page.locator("header img").count() == 0 and page.locator("main img").count() == 0
    actions = page.locator("table.audit tbody tr td:nth-child(4)").all_inner_texts()
    assert {"register", "alias", "drift_recorded", "token_create"} <= set(actions)
    page.select_option("#filter-user", "bob")
    page.click("form.filters button")
    page.wait_for_load_state()
    assert "user=bob" in page.url
    assert page.locator("table.audit tbody tr td:nth-child(3)").all_inner_texts() == ["bob"]
    page.select_option("#filter-user", "")
    page.select_option("#filter-model", "cnn")
    page.click("form.filters button")
    page.wait_for_load_state()
    models = page.locator("table.audit tbody tr td:nth-child(5)").all_inner_texts()
    assert models and all(m.startswith("cnn@") for m in models)
    expected = [e for e in site.registry.audit(model="cnn")]
    assert len(models) == len(expected)
    shot(page, "audit")
    context.close()


def test_a_scoped_token_sees_only_its_models(site, browser):
    context, page = login(browser, site, who="scoped")
    assert [s.get_attribute("data-model") for s in page.locator("section.model").all()] == ["other"]
    response = page.goto(site.url + "/ui/models/cnn/versions/1")
    assert response.status == 403 and page.locator("h1").inner_text() == "Not allowed"
    assert page.goto(site.url + "/ui/diff?a=cnn@1&b=other@1").status == 403
    page.goto(site.url + "/ui/audit")
    shown = set(page.locator("table.audit tbody tr td:nth-child(5)").all_inner_texts())
    assert shown == {"other@1", "other@2"}
    assert page.locator("#filter-model option").all_inner_texts() == ["(all)", "other"]
    # other@2 was converted from cnn@1: the graph shows that a parent exists, never its name or a link to it
    page.goto(site.url + "/ui/models/other/versions/2/lineage")
    assert page.locator("#lineage-graph a.node").evaluate_all("nodes => nodes.map(n => n.dataset.ref)") == ["other@2"]
    assert (
        page.locator("#lineage-graph .hidden-node").count() == 1
        and page.locator("main a[href*='/models/cnn/']").count() == 0
    )
    assert "3 SGD steps" not in page.content()  # the parent's ref (as in the API's Version.parent), nothing else of it
    assert page.locator("#lineage-graph text.edge-label").all_text_contents() == ["converted"]
    page.goto(site.url + "/ui/models/other/versions/1/lineage")  # a note with markup, inside the SVG: text only
    assert page.evaluate("document.scripts.length") == 0 and page.locator("#lineage-graph svg b").count() == 0
    assert "<script>" in page.locator("#lineage-graph svg").text_content()
    page.goto(site.url + "/ui/models/other/versions/2")
    assert page.locator("#parent-link").count() == 0 and page.locator("main a[href*='/models/cnn/']").count() == 0
    page.goto(site.url + "/ui/")
    assert (
        page.locator("main a[href*='/models/cnn/']").count() == 0 and page.locator("main a[href*='diff']").count() == 0
    )
    # the parent's name itself is on none of the pages (the API redacts it the same way)
    for path in (
        "/ui/",
        "/ui/models/other",
        "/ui/models/other/versions/2",
        "/ui/models/other/versions/2/lineage",
        "/ui/audit",
        "/ui/audit?model=other",
    ):
        page.goto(site.url + path)
        assert "cnn@1" not in page.content(), path
    context.close()
