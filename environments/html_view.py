"""The HTML view of a groups file: every turn with its tool calls and their results, all text escaped.

atroposlib's `process` writes `<groups>.html` by rendering each conversation's `content` as Markdown:
an assistant turn that only called a tool shows as empty, a `<tool_call>` tag vanishes as an unknown
HTML tag, and raw HTML passes through, so a model answer (or a web page a tool returned) holding
`<script>` or a `javascript:` link would run in the browser of whoever opens the view. The env
writes the view again from the same JSONL with every piece of text escaped (`html.escape`, in
`<pre>` blocks, no Markdown): the same groups, messages, calls, results and rewards, no markup from
the data.
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


def _pre(value: Any) -> str:
    return f"<pre>{html.escape(_text(value))}</pre>"


def _arguments(raw: Any) -> str:
    if isinstance(raw, str):
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False, indent=1)
        except ValueError:
            return raw  # as the model wrote it
    return json.dumps(raw, ensure_ascii=False, indent=1)


def _message(message: Any) -> str:
    if not isinstance(message, dict):
        return _pre(message)
    role = _text(message.get("role", "?"))
    content = message.get("content") or ""
    if role == "tool":
        name = html.escape(_text(message.get("name") or message.get("tool_call_id") or ""))
        return f"<div><strong>Tool result</strong> ({name}){_pre(content)}</div>"
    parts = [f'<div><span class="role">{html.escape(role)}</span>{_pre(content) if content else ""}']
    for call in message.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            parts.append(_pre(call))
            continue
        name = html.escape(_text(fn.get("name")))
        parts.append(f"<strong>Tool call</strong> <code>{name}</code>{_pre(_arguments(fn.get('arguments')))}")
    return "".join(parts) + "</div>"


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


def write_html_view(groups_path: Path, out: Path | None = None) -> Path:
    """Write `out` (default `<groups_path>.html`, replacing any view already there); returns its path."""
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
    out = out or groups_path.with_suffix(".html")
    out.write_text(page, encoding="utf-8")
    return out
