"""The README stays a front door (short, narrow), and every relative link in it and in `docs/` leads somewhere: to a
file that exists and, with an anchor, to a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
README: Final = ROOT / "README.md"
PAGES: Final = (README, *sorted((ROOT / "docs").glob("*.md")))
MAX_LINES: Final = 300
MAX_COLUMNS: Final = 120
LINK: Final = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """`text` without its fenced code blocks (a `]( ` or `#` in code is not a link or a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of `page`: lower case, punctuation dropped, spaces as hyphens."""
    titles = re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-") for title in titles}


def test_the_readme_is_short_and_narrow() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES
    assert [number for number, line in enumerate(lines, 1) if len(line) > MAX_COLUMNS] == []


def test_every_relative_link_resolves() -> None:
    broken: list[str] = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"^[a-z]+:", target):
                continue  # a URL, not a file of the repository
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_docs_index_links_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    linked = {target.partition("#")[0] for target in LINK.findall(index)}
    assert {page.name for page in PAGES[1:] if page.name != "index.md"} <= linked
