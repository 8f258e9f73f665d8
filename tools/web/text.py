"""HTML -> readable plain text, with a size cap.

Only the standard library's tokenizer: pages get their title, headings (as `#` lines),
paragraphs, list items and table rows; scripts, styles and navigation chrome are dropped.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

__all__ = ["html_to_text", "cap_chars"]

_SKIP = {"script", "style", "noscript", "template", "svg", "nav", "footer", "head"}
_BLOCK = {
    "p",
    "div",
    "section",
    "article",
    "main",
    "header",
    "aside",
    "blockquote",
    "pre",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "table",
    "thead",
    "tbody",
    "tfoot",
    "figure",
    "figcaption",
    "form",
    "hr",
    "address",
}
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}


class _TextBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[str] = []
        self.current: list[str] = []
        self.skip_depth = 0
        self.title: list[str] = []
        self.in_title = False
        self.in_pre = False
        self.row: list[str] | None = None
        self.cell: list[str] | None = None

    def _flush(self) -> None:
        text = "".join(self.current)
        text = text if self.in_pre else re.sub(r"\s+", " ", text).strip()
        if text:
            self.lines.append(text)
        self.current = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self.in_title = True
            return
        if tag in _SKIP:
            self.skip_depth += 1
            return
        if self.skip_depth:
            return
        if tag in _HEADINGS:
            self._flush()
            self.current.append("#" * _HEADINGS[tag] + " ")
        elif tag == "li":
            self._flush()
            self.current.append("- ")
        elif tag == "tr":
            self._flush()
            self.row = []
        elif tag in ("td", "th"):
            self.cell = []
        elif tag == "br":
            self._flush()
        elif tag == "pre":
            self._flush()
            self.in_pre = True
        elif tag in _BLOCK:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
            return
        if tag in _SKIP:
            self.skip_depth = max(0, self.skip_depth - 1)
            return
        if self.skip_depth:
            return
        if tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.append(re.sub(r"\s+", " ", "".join(self.cell)).strip())
            self.cell = None
        elif tag == "tr" and self.row is not None:
            if any(self.row):
                self.lines.append(" | ".join(self.row))
            self.row = None
        elif tag == "pre":
            self._flush()
            self.in_pre = False
        elif tag in _HEADINGS or tag == "li" or tag in _BLOCK:
            self._flush()

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
        elif self.skip_depth:
            return
        elif self.cell is not None:
            self.cell.append(data)
        else:
            self.current.append(data)


def cap_chars(text: str, limit: int) -> str:
    """Keep the start of a page (where its substance usually is) and say what was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... truncated: {len(text) - limit} more characters ...]"


def html_to_text(html: str, max_chars: int | None = None) -> tuple[str, str]:
    """Return (title, text). The text is capped at `max_chars` when given."""
    builder = _TextBuilder()
    builder.feed(html)
    builder.close()
    builder._flush()
    title = re.sub(r"\s+", " ", "".join(builder.title)).strip()
    text = "\n".join(builder.lines)
    return title, cap_chars(text, max_chars) if max_chars is not None else text
