"""Every relative link in the README and docs/ leads somewhere: the file exists, and an
``#anchor`` names a heading of it (as GitHub makes heading anchors) or an ``<a id>``/``<a
name>`` in it. Links inside fenced code blocks and inline code are not links; web addresses
are not checked (no network in the tests).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks").glob("*.md")])
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_EXPLICIT = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def _prose(text: str) -> Iterator[tuple[int, str]]:
    """``text``'s lines outside fenced code blocks, numbered."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lowercased, punctuation other than
    ``-`` and ``_`` removed, spaces made hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors ``path`` defines: its headings' (``-1``, ``-2`` … for repeats) and explicit ones."""
    text = path.read_text(encoding="utf-8")
    found: set[str] = set(_EXPLICIT.findall(text))
    seen: dict[str, int] = {}
    for _, line in _prose(text):
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def _links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in _prose(path.read_text(encoding="utf-8")):
        for match in _LINK.finditer(re.sub(r"`[^`]*`", lambda m: " " * len(m.group()), line)):
            yield number, match.group(1) or match.group(2)


def test_slugs_are_made_as_github_makes_them():
    assert slug("When dpproxy does not start") == "when-dpproxy-does-not-start"
    assert slug("Several cores: `listen.workers`") == "several-cores-listenworkers"
    assert slug("Histograms: GROUP BY over declared keys") == "histograms-group-by-over-declared-keys"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(document: Path):
    broken = []
    for number, target in _links(document):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …
            continue
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        where = f"{document.relative_to(ROOT)}:{number}: {target}"
        if not linked.exists():
            broken.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where}: no anchor #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)
