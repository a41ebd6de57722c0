"""The README stays a short front page: under 10 KB, its first lines the two `make` commands, a project map of at most
10 lines that links docs/layout.md, every docs page linked from it, every relative link alive. Every page in docs/
follows one template (the five sections of TEMPLATE, in order)."""

import re

import pytest

from tests.helpers.launchers import REPO

README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")

# The level-2 sections of every docs/*.md page, in this order, and no others: what the feature is for, how to run it,
# what was measured, how it is tested, its limits. A page with nothing for a section says so in one sentence.
TEMPLATE = ("What it is for", "How to run it", "What was measured", "How it is tested", "Limits")
# docs/layout.md follows the template too. docs/studies/ does not: each study there is one command's report.md and
# results.csv with its caption (hardware, versions, method), laid out by study, not by feature.
TEMPLATE_PAGES = sorted((REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
LEVEL_2 = re.compile(r"^## (.*?)\s*$", re.MULTILINE)


def template_problem(text: str) -> str | None:
    """What breaks the template in a page's text (None when nothing does). `## ` lines inside code blocks are not
    headings; each section must hold some text."""
    text = FENCE.sub("```", text)
    titles = LEVEL_2.findall(text)
    if titles != list(TEMPLATE):
        return f"level-2 sections {titles}, expected exactly {list(TEMPLATE)} in this order"
    bodies = LEVEL_2.split(text)[2::2]
    empty = [title for title, body in zip(titles, bodies) if not body.strip()]
    return f"empty sections {empty}: write one honest sentence" if empty else None


def readme_section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def test_readme_is_short_and_links_every_docs_page():
    text = README.read_text(encoding="utf-8")
    shown = re.sub(r"<!-- field: .*? -->", "", text)  # a figure's field marker is not shown on GitHub
    assert len(shown.encode("utf-8")) <= 10 * 1024
    linked = {m.group(1) for m in LINK.finditer(text)}
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert pages and pages <= linked, f"not linked from README.md: {sorted(pages - linked)}"


def test_readme_opens_with_the_two_make_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# hf-vit-scaling" and lines[2] == "```bash" and lines[5] == "```", lines[:6]
    assert [line.split("#")[0].strip() for line in lines[3:5]] == ["make train", "make test"]


def test_readme_project_map_is_at_most_10_lines_and_links_the_layout_page():
    section = readme_section("Project structure")
    lines = [line for line in section.splitlines() if line.strip() and not line.startswith("```")]
    assert len(lines) <= 10, f"the project map has {len(lines)} lines: the detail belongs in docs/layout.md"
    assert "docs/layout.md" in {m.group(1) for m in LINK.finditer(section)}


@pytest.mark.parametrize("page", TEMPLATE_PAGES, ids=lambda p: p.name)
def test_docs_page_has_the_five_sections_in_order(page):
    problem = template_problem(page.read_text(encoding="utf-8"))
    assert problem is None, f"{page.relative_to(REPO)}: {problem}"


def test_template_check_refuses_a_missing_moved_extra_or_empty_section():
    sections = [f"## {title}\n\nText.\n" for title in TEMPLATE]
    page = "# A page\n\n" + "\n".join(sections)
    assert template_problem(page) is None
    assert template_problem(page.replace("## How it is tested\n", "")) is not None  # missing
    swapped = "\n".join([sections[0], sections[2], sections[1], *sections[3:]])
    assert template_problem("# A page\n\n" + swapped) is not None  # out of order
    assert template_problem(page + "\n## Notes\n\nMore.\n") is not None  # an extra level-2 section
    assert template_problem(page.replace("## Limits\n\nText.", "## Limits\n")) is not None  # empty
    fenced = page.replace("## Limits\n", "```\n## Limits\n```\n")  # a `## ` line in a code block is no heading
    assert template_problem(fenced) is not None


def test_relative_links_in_readme_and_docs_resolve():
    for page in [README, *(REPO / "docs").rglob("*.md")]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to missing {target}"
