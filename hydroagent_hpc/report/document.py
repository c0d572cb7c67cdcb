"""The report as a list of blocks, rendered to Markdown and to one self-contained HTML page.

Blocks: :class:`Heading`, :class:`Paragraph` and :class:`Bullets` (inline ``**bold**`` and
```code``` only),
:class:`Table` (text cells), :class:`Figure` (a PNG written beside the report). The HTML page
embeds every figure as a base64 ``data:`` URI and uses no external stylesheet, script or font,
so it can be mailed or archived as one file. Both renderers are pure: the same blocks give the
same bytes.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Heading", "Paragraph", "Bullets", "Table", "Figure", "Block", "to_markdown", "to_html"]


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2
    anchor: str = ""


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table of text cells; ``align`` is "l" or "r" per column (default: left)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align: tuple[str, ...] = ()
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    """A PNG figure; ``path`` is relative to the report's folder."""

    path: str
    caption: str


Block = Heading | Paragraph | Bullets | Table | Figure


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    """GitHub-flavoured Markdown; figures link to their PNG files."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Paragraph):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            if b.caption:
                out.append(b.caption)
            align = b.align or ("l",) * len(b.columns)
            lines = ["| " + " | ".join(_md_cell(c) for c in b.columns) + " |",
                     "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("\n".join(lines))
        elif isinstance(b, Figure):
            out.append(f"![{b.caption}]({b.path})\n\n*{b.caption}*")
        else:  # pragma: no cover - the Block union is closed
            raise TypeError(f"unknown report block {b!r}")
    return "\n\n".join(out) + "\n"


_INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`")


def _inline_html(text: str) -> str:
    parts, pos = [], 0
    for m in _INLINE.finditer(text):
        parts.append(html.escape(text[pos:m.start()]))
        if m.group(1) is not None:
            parts.append(f"<strong>{html.escape(m.group(1))}</strong>")
        else:
            parts.append(f"<code>{html.escape(m.group(2))}</code>")
        pos = m.end()
    parts.append(html.escape(text[pos:]))
    return "".join(parts)


_CSS = """body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
table{border-collapse:collapse;margin:0.8em 0;font-size:0.9em}
th,td{border:1px solid #ccc;padding:0.25em 0.5em;vertical-align:top}
th{background:#f0f0f0}td.r{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:1em 0}img{max-width:100%}figcaption{font-style:italic;color:#555}
code{background:#f4f4f4;padding:0 0.2em}"""


def to_html(blocks: list[Block], title: str, folder: Path) -> str:
    """One HTML page; figures are read from ``folder / path`` and embedded as base64 PNG."""
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{html.escape(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>"]
    for b in blocks:
        if isinstance(b, Heading):
            anchor = f' id="{html.escape(b.anchor)}"' if b.anchor else ""
            out.append(f"<h{b.level}{anchor}>{_inline_html(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            out.append(f"<p>{_inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            out.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in b.items) + "</ul>")
        elif isinstance(b, Table):
            align = b.align or ("l",) * len(b.columns)
            if b.caption:
                out.append(f"<p>{_inline_html(b.caption)}</p>")
            out.append("<table>")
            out.append("<tr>" + "".join(f"<th>{_inline_html(c)}</th>" for c in b.columns) + "</tr>")
            for row in b.rows:
                cells = "".join(f'<td class="r">{_inline_html(c)}</td>' if a == "r" else f"<td>{_inline_html(c)}</td>"
                                for c, a in zip(row, align))
                out.append(f"<tr>{cells}</tr>")
            out.append("</table>")
        elif isinstance(b, Figure):
            data = base64.b64encode((folder / b.path).read_bytes()).decode("ascii")
            out.append(f'<figure><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{_inline_html(b.caption)}</figcaption></figure>")
        else:  # pragma: no cover
            raise TypeError(f"unknown report block {b!r}")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
