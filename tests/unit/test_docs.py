"""The README stays a short front page: under 10 KB, every docs page linked from it, every relative link alive."""

import re

from tests.helpers import REPO

README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_is_short_and_links_every_docs_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 10 * 1024
    linked = {m.group(1) for m in LINK.finditer(text)}
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert pages and pages <= linked, f"not linked from README.md: {sorted(pages - linked)}"


def test_relative_links_in_readme_and_docs_resolve():
    for page in [README, *(REPO / "docs").rglob("*.md")]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to missing {target}"
