"""The HTML view of a groups file, with every piece of text escaped.

atroposlib's `process` writes `<groups>.html` by rendering each conversation as Markdown, which
passes raw HTML through: a model answer (or a web page a tool returned) holding `<script>` or a
`javascript:` link would run in the browser of whoever opens the view. The env writes the view
again from the same JSONL with everything as text (`html.escape`, in `<pre>` blocks): the same
groups, messages and rewards, no markup from the data.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from environments.jsonl import jsonl_lines

__all__ = ["write_html_view"]

_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;"
    "padding:.5em}.role{font-weight:bold}.pos{border-left:4px solid #3a3}.neg{border-left:4px solid #c33}"
    ".item{margin:.5em 0;padding-left:.5em}"
)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _message(message: Any) -> str:
    if not isinstance(message, dict):
        return f"<pre>{html.escape(_text(message))}</pre>"
    role = html.escape(_text(message.get("role", "?")))
    parts = [_text(message.get("content") or "")]
    if message.get("tool_calls"):
        parts.append(_text(message["tool_calls"]))
    return f'<div><span class="role">{role}</span><pre>{html.escape(chr(10).join(parts))}</pre></div>'


def _group(index: int, group: dict[str, Any]) -> str:
    items = []
    scores = group.get("scores") or []
    for i, messages in enumerate(group.get("messages") or []):
        score = scores[i] if i < len(scores) else None
        kind = "pos" if isinstance(score, (int, float)) and score > 0 else "neg"
        body = "".join(_message(m) for m in messages) if isinstance(messages, list) else _message(messages)
        reward = html.escape(_text(score))
        items.append(f'<div class="item {kind}"><h4>Rollout {i}: reward {reward}</h4>{body}</div>')
    return f"<details><summary>Group {index}</summary>{''.join(items)}</details>"


def write_html_view(groups_path: Path) -> Path:
    """Write `<groups_path>.html` (replacing any view already there); returns its path."""
    groups: list[str] = []
    for n, line in jsonl_lines(groups_path.read_text(encoding="utf-8")):
        try:
            row = json.loads(line)
        except ValueError:
            row = {"messages": [[{"role": "?", "content": f"line {n} is not JSON"}]]}
        groups.append(_group(len(groups), row if isinstance(row, dict) else {}))
    title = html.escape(groups_path.name)
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{title}</h1>{''.join(groups)}</body></html>\n"
    )
    out = groups_path.with_suffix(".html")
    out.write_text(page, encoding="utf-8")
    return out
