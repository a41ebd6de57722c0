"""The markdown table every renderer returns, and the cell formats several share."""


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def strong(text: str, on: bool = True) -> str:
    """`text` in bold where `on` (the figures a target is set on)."""
    return f"**{text}**" if on else text


def sig(x: float) -> str:
    """Three significant figures; from 100 up the whole number with thousands separated."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
