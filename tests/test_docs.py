"""The documentation stays true to the commands and to itself (in the style of sqlite-utils' tests/test_docs.py).

docs/cli.md is rendered again from every command's --help and compared with the committed page;
every command must have help and an example; the pages in docs/ and the nav of mkdocs.yml must
name the same files; every relative link of the README and the pages must resolve; the README
stays short and starts with the two commands. The site itself is built with --strict by
`make docs` (.ci/run), which also checks anchors.
"""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli.commands.inspect import HAZARD_EXIT_CODE
from cli.commands.monitoring import DRIFT_EXIT_CODE, UNCONVERGED_EXIT_CODE
from cli.docs_reference import PAGE, command_helps
from schemas.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 150

COMMANDS = command_helps()
PAGES = sorted(DOCS.rglob("*.md"))
#: [text](target) and ![alt](target), with an optional "title".
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: [label]: target
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def rendered_reference() -> str:
    """docs/cli.md as `make docs-cli` would write it, rendered in a fresh process
    (as the command's import order has it)."""
    done = subprocess.run(
        [sys.executable, "-m", "cli.docs_reference", "-"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_cli_reference_is_current():
    expected = rendered_reference()
    current = PAGE.read_text()
    if current != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    current.splitlines(True), expected.splitlines(True), "docs/cli.md", "rendered help"
                )
            )[:40]
        )
        pytest.fail(f"docs/cli.md differs from the commands' --help; run `make docs-cli` to update it:\n{diff}")


def test_the_reference_lists_every_command_of_the_app():
    """Groups and their subcommands are found by walking the app, not from a list kept here."""
    names = [entry.name for entry in COMMANDS]
    assert names[0] == "normbridge" and len(names) == len(set(names))
    assert {"normbridge convert", "normbridge token create", "normbridge mlflow import"} <= set(names)
    page = PAGE.read_text()
    for name in names:
        assert f"## {name} {{#" in page, f"docs/cli.md has no section for `{name}`"


@pytest.mark.parametrize("entry", COMMANDS, ids=lambda entry: entry.name)
def test_every_command_has_help_and_an_example(entry):
    assert entry.short_help.strip(), f"`{entry.name}` has no help text: give its function a docstring"
    if entry.path:  # the app's own --help lists the commands instead
        assert "Example" in entry.text, (
            f"`{entry.name} --help` shows no example: add an 'Example: {entry.name} ...' line to its docstring"
        )
    missing = [name for name, text in entry.parameters if not (text or "").strip()]
    assert not missing, f"`{entry.name}` has options or arguments without help: {', '.join(missing)}"


def nav_pages(node) -> list[str]:
    """Every page a mkdocs nav names (entries are 'page.md', {title: 'page.md'} or {title: [entries]})."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    raise TypeError(f"unexpected nav entry {node!r} in mkdocs.yml")


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    in_nav = nav_pages(config["nav"])
    on_disk = [page.relative_to(DOCS).as_posix() for page in PAGES]
    assert len(in_nav) == len(set(in_nav)), (
        f"mkdocs.yml names a page twice: {sorted(p for p in in_nav if in_nav.count(p) > 1)}"
    )
    assert not sorted(set(on_disk) - set(in_nav)), (
        f"pages missing from the nav of mkdocs.yml: {sorted(set(on_disk) - set(in_nav))}"
    )
    assert not sorted(set(in_nav) - set(on_disk)), (
        f"mkdocs.yml names pages that do not exist in docs/: {sorted(set(in_nav) - set(on_disk))}"
    )


def prose(text: str) -> str:
    """`text` without fenced code blocks and inline code, where brackets are not links."""
    kept, fence = [], None
    for line in text.splitlines():
        marker = re.match(r"^\s*(`{3,}|~{3,})", line)
        if marker and (fence is None or marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence)):
            fence = None if fence else marker.group(1)
            continue
        if fence is None:
            kept.append(re.sub(r"(`+).+?\1", "", line))
    return "\n".join(kept)


def relative_links(path: Path) -> list[str]:
    text = prose(path.read_text())
    targets = INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)
    return [t for t in targets if not URL_SCHEME.match(t) and not t.startswith("#")]


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_to_a_file(path):
    for target in relative_links(path):
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        assert resolved.exists(), f"{path.relative_to(ROOT)} links to '{target}', which does not exist"
        if path.is_relative_to(DOCS):
            assert resolved.is_relative_to(DOCS), (
                f"{path.relative_to(ROOT)} links to '{target}' outside docs/, which the site does not hold; name the file as `code` instead"
            )


def test_the_link_checker_sees_links_and_skips_code():
    sample = "see [a](a.md), ![b](img/b.png) and [c](https://x.org)\n`[d](d.md)`\n```\n[e](e.md)\n```\n[f]: f.md\n"
    targets = INLINE_LINK.findall(prose(sample)) + REFERENCE_LINK.findall(prose(sample))
    assert targets == ["a.md", "img/b.png", "https://x.org", "f.md"]


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move the detail to a page in docs/"
    )
    assert lines[0].startswith("# ") and lines[1] == "" and lines[2] == "```sh", (
        "README.md must open with its title, then the two commands"
    )
    assert lines[3].startswith("make demo ") and lines[4].startswith("make test ") and lines[5] == "```", lines[2:6]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test", "docs", "docs-cli"):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"the Makefile has no `{target}` target"


def section(text: str, heading: str) -> str:
    """From `heading` up to the next heading of the same level."""
    start = text.index(heading + "\n")
    level = heading.split(" ", 1)[0] + " "
    end = (
        next((m.start() for m in re.finditer(rf"^{level}", text[start + 1 :], re.M)), len(text) - start - 1) + start + 1
    )
    return text[start:end]


def test_the_site_home_installs_as_the_readme_does():
    assert section((DOCS / "index.md").read_text(), "## Install") == section(README.read_text(), "## Install"), (
        "the Install sections of README.md and docs/index.md differ: keep them identical"
    )


def test_every_exit_code_is_in_the_exit_code_table():
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", (DOCS / "commands.md").read_text(), re.M)}
    used = set(EXIT_CODES.values()) | {0, 1, 2, HAZARD_EXIT_CODE, DRIFT_EXIT_CODE, UNCONVERGED_EXIT_CODE}
    assert not sorted(used - documented), f"docs/commands.md does not list exit codes {sorted(used - documented)}"
