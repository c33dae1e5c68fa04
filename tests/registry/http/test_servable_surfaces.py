"""The servable verdict where users read it, and the production guard where they move aliases:
a real `normbridge serve`.

One server (SQLite + blobs in a temp dir) started with `--guarded-alias production --guarded-alias canary`, holding a
.pt2 exported in train mode (uploaded as an artifact bundle, the streamed registration), BatchNorms that never saw data
(a .pt2 upload), a trained eval model, and a BatchNorm with momentum=None whose Keras and ONNX targets cannot express
it. The CLI runs with --server (in-process, Typer's CliRunner), the API through httpx, the pages in headless Chromium.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest
import torch
from typer.testing import CliRunner

from registry.artifact import extract_artifact
from registry.manifest_io import save_artifact_folder
from registry.service import Registry
from tests.http_server import create_token, running_server
from tests.registry.test_registry_service import SmallCNN, save_pt2, trained_cnn
from tests.registry.web.test_web import browser, login, readme_copy, shot  # noqa: F401 (browser is a fixture)

pytestmark = pytest.mark.slow  # starts a server and a browser

REMOTE_ENV = (
    "NORMBRIDGE_SERVER",
    "NORMBRIDGE_TOKEN",
    "NORMBRIDGE_DB",
    "NORMBRIDGE_BLOBS",
    "NORMBRIDGE_GUARDED_ALIASES",
)
#: The stock BatchNorms of SmallCNN, where every hazard of these models sits.
BATCHNORMS = ["bn1", "bn2"]


@dataclass
class Surfaces:
    url: str
    tokens: dict[str, str]
    db: str
    blobs: str
    registered: dict[str, dict]  # model name -> `register --json` answer


def cli(surfaces: Surfaces, *args: str, token: str = "writer"):
    from cli.main import app

    prefix = ["--server", surfaces.url, "--token", surfaces.tokens[token]]
    return CliRunner().invoke(app, prefix + list(args), env={k: None for k in REMOTE_ENV} | {"COLUMNS": "200"})


def answer(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def cumulative_momentum_model() -> torch.nn.Module:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3, momentum=None))
    with torch.no_grad():
        model.train()
        for _ in range(3):
            model(torch.randn(16, 4))
    return model.eval()


@pytest.fixture(scope="module")
def surfaces(tmp_path_factory):
    root = tmp_path_factory.mktemp("servable")
    train_mode = save_pt2(trained_cnn().train(), root / "train-mode.pt2")
    bundle = save_artifact_folder(extract_artifact(train_mode), root / "train-mode-artifact")
    fresh = save_pt2(SmallCNN().eval(), root / "fresh.pt2")
    clean = save_pt2(trained_cnn(), root / "clean.pt2")
    cumulative = root / "cumulative.pt2"
    torch.export.save(torch.export.export(cumulative_momentum_model(), (torch.randn(2, 4),)), str(cumulative))
    db, blobs = f"sqlite:///{root / 'registry.db'}", str(root / "blobs")
    with running_server(
        db=db, blobs=blobs, log=root / "serve.log", args=["--guarded-alias", "production", "--guarded-alias", "canary"]
    ) as server:
        state = Surfaces(
            server.url,
            {"writer": create_token(db, "alice", "write"), "reader": create_token(db, "bob", "read")},
            db,
            blobs,
            {},
        )
        for name, path in (("trainmode", bundle), ("fresh", fresh), ("clean", clean), ("cumulative", cumulative)):
            state.registered[name] = answer(cli(state, "register", name, str(path), "--json"))
        yield state


def test_show_and_versions_say_which_version_may_not_serve_and_why(surfaces):
    registered = surfaces.registered
    assert [registered[n]["version"]["servable"] for n in ("trainmode", "fresh", "clean", "cumulative")] == [
        False,
        False,
        True,
        True,
    ]
    shown = answer(cli(surfaces, "show", "trainmode@1", "--json", token="reader"))
    assert shown["servable"] is False
    assert [(h["code"], h["layer"], h["severity"], h["blocking"]) for h in shown["hazards"] if h["blocking"]] == [
        ("train_mode", layer, "error", True) for layer in BATCHNORMS
    ]
    # trained_cnn counted 3 batches at momentum 0.1: 73% of the initial statistics left, recorded beside, never blocking
    assert [(h["code"], h["layer"], h["severity"]) for h in shown["hazards"] if not h["blocking"]] == [
        ("unconverged_statistics", layer, "warning") for layer in BATCHNORMS
    ]
    fresh = answer(cli(surfaces, "show", "fresh", "--json", token="reader"))
    assert [(h["code"], h["layer"], h["blocking"]) for h in fresh["hazards"]] == [
        ("never_trained", layer, True) for layer in BATCHNORMS
    ]
    clean = answer(cli(surfaces, "show", "clean@1", "--json", token="reader"))
    assert clean["servable"] is True and not any(h["blocking"] for h in clean["hazards"])
    assert [(h["code"], h["layer"]) for h in clean["hazards"]] == [
        ("unconverged_statistics", layer) for layer in BATCHNORMS
    ]
    cumulative = answer(cli(surfaces, "show", "cumulative@1", "--json", token="reader"))
    assert cumulative["servable"] is True and [(h["code"], h["blocking"]) for h in cumulative["hazards"]] == [
        ("momentum_none", False)
    ]

    text = cli(surfaces, "show", "trainmode@1", token="reader")
    assert (
        text.exit_code == 0
        and "not servable: train_mode at bn1, bn2" in text.stdout
        and "exported in train mode" in text.stdout
    )
    shown_clean = cli(surfaces, "show", "clean@1", token="reader").stdout
    assert (
        "servable: no hazard blocks serving" in shown_clean
        and "warning unconverged_statistics at bn1: num_batches_tracked=3" in shown_clean
    )
    assert "yes (warns: unconverged_statistics)" in cli(surfaces, "versions", "clean", token="reader").stdout
    listed = cli(surfaces, "versions", "fresh", token="reader")
    assert listed.exit_code == 0 and "NO: never_trained" in listed.stdout
    assert answer(cli(surfaces, "versions", "clean", "--json", token="reader"))["versions"][0]["servable"] is True
    with httpx.Client(base_url=surfaces.url, headers={"Authorization": f"Bearer {surfaces.tokens['reader']}"}) as http:
        assert http.get("/api/v1/models/trainmode/versions/1").json()["servable"] is False
        assert [v["servable"] for v in http.get("/api/v1/models/fresh/versions").json()["versions"]] == [False]


def test_the_guard_refuses_over_the_cli_and_http_and_force_is_audited(surfaces):
    refused = cli(surfaces, "alias", "trainmode", "production", "trainmode@1")
    assert refused.exit_code == 22, refused.output
    assert "trainmode@production' is guarded and trainmode@1 is not servable: train_mode at bn1" in refused.output
    canary = cli(surfaces, "alias", "trainmode", "canary", "trainmode@1")  # guarded by the server's --guarded-alias
    assert canary.exit_code == 22, canary.output
    assert answer(cli(surfaces, "alias", "trainmode", "staging", "trainmode@1", "--json"))["number"] == 1  # not guarded

    writer = {"Authorization": f"Bearer {surfaces.tokens['writer']}"}
    with httpx.Client(base_url=surfaces.url, headers=writer) as http:
        put = http.put("/api/v1/models/fresh/aliases/production", json={"version": 1})
        assert put.status_code == 409 and put.json()["error"]["code"] == "not_servable"
        assert "never_trained at bn1" in put.json()["error"]["message"]
        assert http.get("/api/v1/models/fresh/aliases").json() == []
        forced = http.put("/api/v1/models/fresh/aliases/production", params={"force": "true"}, json={"version": 1})
        assert forced.status_code == 200 and forced.json()["number"] == 1
        assert http.put("/api/v1/models/clean/aliases/production", json={"version": 1}).status_code == 200

    moved = answer(cli(surfaces, "alias", "trainmode", "production", "trainmode@1", "--force", "--json"))
    assert (moved["alias"], moved["number"], moved["user"]) == ("production", 1, "alice")
    log = answer(cli(surfaces, "audit", "--verify", "--json", token="reader"))
    assert log["chain_ok"] is True
    aliases = [
        (e["model"], e["action"], e["detail"].get("alias"), e["detail"].get("forced"), e["detail"].get("not_servable"))
        for e in log["entries"]
        if e["action"] in ("alias", "alias_refused")
    ]
    assert aliases == [
        ("trainmode", "alias_refused", "production", None, None),
        ("trainmode", "alias_refused", "canary", None, None),
        ("trainmode", "alias", "staging", None, None),
        ("fresh", "alias_refused", "production", None, None),
        ("fresh", "alias", "production", True, ["never_trained"]),
        ("clean", "alias", "production", None, None),
        ("trainmode", "alias", "production", True, ["train_mode"]),
    ]
    registrations = {e["model"]: e["detail"].get("not_servable") for e in log["entries"] if e["action"] == "register"}
    assert registrations == {"trainmode": ["train_mode"], "fresh": ["never_trained"], "clean": None, "cumulative": None}
    assert Registry(db=surfaces.db, blobs=surfaces.blobs).verify_audit() == []


def test_the_pages_do_not_show_a_version_that_may_not_serve_as_green(surfaces, browser):  # noqa: F811
    context, page = login(browser, surfaces, who="reader")
    for name in ("trainmode", "fresh"):
        section = page.locator(f"section.model[data-model='{name}']")
        assert section.locator("h2 .latest-not-servable").inner_text() == "latest version not servable"
        assert section.locator(f"tr[data-ref='{name}@1'] .verdict").inner_text() == "not servable"
    clean = page.locator("section.model[data-model='clean']")
    assert (
        clean.locator("h2 .latest-not-servable").count() == 0
        and clean.locator("tr[data-ref='clean@1'] .verdict").inner_text() == "passed"
    )
    assert (
        clean.locator("tr[data-ref='clean@1'] .warns").inner_text() == "warns: unconverged_statistics"
    )  # green, and says what to look at
    shot(page, "models-not-servable")

    page.goto(surfaces.url + "/ui/models/trainmode/versions/1")
    headline = page.locator("h1")
    assert headline.locator("#servable-verdict").inner_text() == "not servable"
    assert (
        headline.locator(".verdict.passed").count() == 0
    )  # no green "equivalence passed" above a version that may not serve
    green = headline.locator("#servable-verdict").evaluate("e => getComputedStyle(e).color")
    assert green == "rgb(220, 38, 38)"  # --red
    rows = page.locator("table.hazards tbody tr")
    # one row per distinct hazard, listing its layers (issue 35 §3); the API keeps one entry per layer
    shown = [
        (r.get_attribute("data-hazard"), r.get_attribute("data-layers"), r.locator("td").nth(2).inner_text())
        for r in rows.all()
    ]
    assert shown[0] == ("train_mode", " ".join(BATCHNORMS), "yes")  # the same message at both layers: one row
    assert {(code, blocks) for code, _, blocks in shown[1:]} == {
        ("unconverged_statistics", "no")
    }  # worded per layer's counter
    assert sorted(layer for _, layers, _ in shown[1:] for layer in layers.split()) == BATCHNORMS
    layer_hazard = page.locator("table.layers tr[data-layer='bn1'] td").nth(9).locator("a").first
    assert layer_hazard.inner_text() == "train_mode"
    assert "exported in train mode" in layer_hazard.get_attribute(
        "title"
    )  # the layer table words it as the verdict does
    readme_copy(shot(page, "version-not-servable"), "version-not-servable.png")

    page.goto(surfaces.url + "/ui/models/clean/versions/1")
    assert page.locator("h1 #servable-verdict").inner_text() == "servable"
    assert (
        page.locator("table.hazards tr[data-hazard='unconverged_statistics'][data-layers~='bn1'] td")
        .nth(2)
        .inner_text()
        == "no"
    )
    assert page.locator("h1 .verdict.passed").inner_text() == "equivalence passed"

    page.goto(surfaces.url + "/ui/models/cumulative/versions/1")  # Keras and ONNX cannot express momentum=None
    outcomes = {
        r.locator("td").nth(1).inner_text(): r.locator(".verdict").inner_text()
        for r in page.locator("table.equivalence tbody tr").all()
    }
    assert outcomes == {"torch → torch": "ok", "torch → keras": "not converted", "torch → onnx": "not converted"}
    assert "cannot convert to onnx" in page.locator("table.equivalence").inner_text()
    assert page.locator("table.hazards tr[data-hazard='momentum_none'] td").nth(2).inner_text() == "no"
    context.close()
