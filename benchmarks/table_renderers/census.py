"""The figure census: how many figures of each class each markdown page holds (benchmarks/figures.py)."""

from .cells import table


def figure_counts(result: dict) -> str:
    """One row per page holding figures, one column per class, and the total."""
    kinds, pages = result["kinds"], result["pages"]
    rows = [[f"`{page}`", *(str(counts.get(kind, 0)) for kind in kinds)] for page, counts in pages.items()]
    rows.append(["all", *(str(sum(counts.get(kind, 0) for counts in pages.values())) for kind in kinds)])
    return table(["page", *kinds], rows)
