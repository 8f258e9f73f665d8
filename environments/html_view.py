"""The HTML view of `process` output: every turn with its tool calls and their results.

atroposlib's `generate_html` shows each message's `content` only (an assistant turn that only
called a tool shows as empty) and renders it as Markdown unescaped (a `<tool_call>` tag vanishes
as an unknown HTML tag). This writes the same page from the same JSONL with calls, arguments and
tool results shown, all model text escaped, through atroposlib's own page template.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from atroposlib.frontend.jsonl2html import generate_html

__all__ = ["conversation_markdown", "write_html_view"]


def _fenced(text: str) -> str:
    fence = "~~~~" if "~~~" in text else "~~~"
    return f"{fence}\n{text}\n{fence}"


def _arguments(raw: Any) -> str:
    if isinstance(raw, str):
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False, indent=1)
        except ValueError:
            return raw  # as the model wrote it
    return json.dumps(raw, ensure_ascii=False, indent=1)


def conversation_markdown(messages: list[dict[str, Any]]) -> str:
    """One conversation as Markdown: text escaped, calls and results as code blocks."""
    parts = []
    for m in messages:
        role = str(m.get("role", "unknown"))
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False) if content else ""
        if role == "tool":
            parts.append(f"**Tool result** ({html.escape(str(m.get('name', '')))}):\n\n{_fenced(text)}")
            continue
        line = f"**{role.capitalize()}**: {html.escape(text)}" if text.strip() else f"**{role.capitalize()}**:"
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            line += (
                f"\n\n**Tool call** `{html.escape(str(fn.get('name')))}`:\n\n{_fenced(_arguments(fn.get('arguments')))}"
            )
        parts.append(line)
    return "\n\n".join(parts)


def write_html_view(jsonl: Path, out: Path | None = None) -> Path:
    """Write `out` (default: `jsonl` with .html) from the scored groups in `jsonl`."""
    out = out or jsonl.with_suffix(".html")
    with tempfile.TemporaryDirectory() as tmp:
        shown = Path(tmp) / "groups.jsonl"
        with open(jsonl, encoding="utf-8") as src, open(shown, "w", encoding="utf-8") as dst:
            for line in src:
                if not line.strip():
                    continue
                group = json.loads(line)
                messages = [conversation_markdown(c) if isinstance(c, list) else c for c in group.get("messages") or []]
                dst.write(json.dumps({"messages": messages, "scores": group.get("scores") or []}) + "\n")
        with contextlib.redirect_stdout(io.StringIO()):  # its "generated" line: atroposlib already printed one
            generate_html(str(shown), str(out))
    return out
