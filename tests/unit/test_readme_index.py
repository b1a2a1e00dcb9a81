"""README.md is where a newcomer finds the documentation: every page under docs/ is linked
from it, and every docs/ link in it names a page that exists."""

from __future__ import annotations

import re

from tests.conftest import REPO

README = REPO / "README.md"
DOCS_LINK = re.compile(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)")


def linked_pages() -> set[str]:
    return set(DOCS_LINK.findall(README.read_text()))


def test_every_docs_page_is_linked_from_the_readme() -> None:
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")}
    missing = sorted(pages - linked_pages())
    assert not missing, f"docs pages README.md does not link: {missing}"


def test_every_docs_link_in_the_readme_resolves() -> None:
    broken = sorted(page for page in linked_pages() if not (REPO / page).is_file())
    assert not broken, f"README.md links pages that do not exist: {broken}"
