"""The front door and docs/: every relative link resolves, and the settings page matches SETTINGS."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conformance.settings import settings_table
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SETTINGS_PAGE = REPO / "docs" / "settings.md"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' in a code block is no heading
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, "\n".join(broken)


def test_the_readme_stays_a_front_door() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


def test_the_settings_page_is_generated_from_settings() -> None:
    """Stale when a setting was added or changed: `python tools/settings_doc.py` writes it again."""
    assert settings_table() in SETTINGS_PAGE.read_text(), "docs/settings.md is stale: run python tools/settings_doc.py"


def test_the_tutorial_comes_first_and_help_shows_three_examples(pytester: pytest.Pytester) -> None:
    readme = (REPO / "README.md").read_text()
    assert readme.index("docs/tutorial.md") < readme.index("## Set up and run")  # linked before anything else
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "conformance", "--help"], capture_output=True, text=True, timeout=60)
    examples = done.stdout.split("examples:")[1]
    assert sum(line.strip().startswith("conformance ") for line in examples.splitlines()) == 3, done.stdout
    suite = pytester.runpytest_subprocess("-p", "conformance.plugin", "--help")
    assert "Examples: pytest suites/ (this machine, as it is)" in " ".join(suite.stdout.str().split())
