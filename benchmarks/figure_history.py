"""A labelled figure's commit, looked up in git (part of benchmarks/figures.py's check): it must exist and hold the
figure, or be named in a change that added or removed it."""

import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HISTORY = REPO  # the repository whose history a label's commit is looked up in (pages may be read from elsewhere)


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=HISTORY, capture_output=True, text=True)


def unheld_commits(figures: list, number_of: Callable[[str], str]) -> list[str]:
    """One line per figure labelled with an earlier measurement's commit that git does not know, or that neither
    holds the figure in its files nor is named in a change that added or removed the figure (a results file's
    provenance, a page's "measured at <hash>"): a made-up hash, or a figure retyped after it was measured.
    `figures`: benchmarks/figures.py's Figure records (page, line, text, commits); `number_of`: a figure's number."""
    numbers = {figure: number_of(figure.text) for figure in figures}
    by_commit: dict[str, set[str]] = {}
    for figure in figures:
        for commit in figure.commits:
            by_commit.setdefault(commit, set()).add(numbers[figure])
    known = {commit for commit in by_commit if git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0}
    held = set()
    for commit in known:  # one search of each commit's files for all the figures labelled with it
        patterns = [arg for number in sorted(by_commit[commit]) for arg in ("-e", number)]
        out = git("grep", "-F", "-o", "-h", *patterns, commit, "--").stdout
        held |= {(commit, number) for number in by_commit[commit] if number in out}

    @cache
    def changes_naming(number: str) -> str:
        """Every diff that added or removed `number` (git's pickaxe), outside tests/, one text."""
        return git("log", "-S", number, "-p", "--format=%H", "--", ".", ":!tests").stdout  # not a test's sample

    found = []
    for figure in figures:
        number = numbers[figure]
        named = [c for c in figure.commits if c in known]
        if not named:
            why = f"names commit {', '.join(figure.commits)}, which is not in this repository's history"
        elif any((c, number) in held or c in changes_naming(number) for c in named):
            continue
        else:
            why = f"names commit {', '.join(named)}, which neither holds {number} nor is named where it was added"
        found.append(f"{figure.page}:{figure.line}: the figure '{figure.text}' {why}. Fix: name the commit the "
                     "figure was measured at (and record it), or bind the figure to its results file")  # fmt: skip
    return found
