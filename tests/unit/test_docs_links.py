"""The README's and docs/'s relative links resolve: every linked file exists, and every ``#anchor`` names a
heading of the target (GitHub's slug rule) or an explicit ``<a id=...>``. A renamed section otherwise
leaves its links dead without a sound."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, ``_``, ``-`` and
    spaces kept), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    """A page's anchors: its headings' slugs (a repeated one gets ``-1``, ``-2``, ...) and explicit ids."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found, seen = set(), {}
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        s = slug(heading)
        found.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return found | set(re.findall(r'<a id="([^"]+)"', text))


def dead_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(f"{page.name}: {target} (no file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            dead.append(f"{page.name}: {target} (no such section)")
    return dead


def test_the_slug_rule_matches_githubs():
    assert slug("Weight average — trainer.ema_decay") == "weight-average--trainerema_decay"
    assert slug("Where issue 17 stands (2026-12-03, updated 2026-12-07)") == (
        "where-issue-17-stands-2026-12-03-updated-2026-12-07"
    )


def test_a_dead_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n## Part one\n\n[ok](#part-one) [gone](#part-two) [file](missing.md)\n")
    assert dead_links(page) == ["page.md: #part-two (no such section)", "page.md: missing.md (no file)"]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    assert dead_links(page) == []
