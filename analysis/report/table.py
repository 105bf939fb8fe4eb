"""One readable table (a header and rows of strings) rendered as markdown, TeX or HTML: what
index.html, fits.md and privilege.md show of a report table (its CSV holds every column)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Table", "latex_escape"]


@dataclass(frozen=True)
class Table:
    """A readable table: a header and rows of strings, rendered to each format."""

    header: Sequence[str]
    rows: Sequence[Sequence[str]]

    def drop(self, column: str) -> Table:
        """The same table without ``column``."""
        i = list(self.header).index(column)
        return Table([h for j, h in enumerate(self.header) if j != i], [[c for j, c in enumerate(r) if j != i] for r in self.rows])

    def markdown(self) -> list[str]:
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

        return [line(self.header), "|" + "|".join("---" for _ in self.header) + "|", *map(line, self.rows)]

    def latex(self) -> list[str]:
        head = " & ".join(latex_escape(h) for h in self.header).replace("R$^2$", "$R^2$")
        return [
            r"\begin{tabular}{" + "l" * len(self.header) + "}",
            r"\toprule",
            head + r" \\",
            r"\midrule",
            *(" & ".join(latex_escape(c) for c in row) + r" \\" for row in self.rows),
            r"\bottomrule",
            r"\end{tabular}",
        ]

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in self.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def latex_escape(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                 ("#", r"\#"), ("$", r"\$"), ("{", r"\{"), ("}", r"\}"), ("·", r"$\cdot$"),
                 ("−", "$-$"), ("—", "---"), ("²", "$^2$"), ("≤", r"$\le$"), ("×", r"$\times$"), ("~", r"\textasciitilde{}")):  # fmt: skip
        s = s.replace(a, b) if a != "\\" else s.replace(a, "\x00")
    return s.replace("\x00", r"\textbackslash{}")
