"""The process output's HTML view shows each tool call with its arguments and the tool's result."""

from __future__ import annotations

import json

from environments.html_view import write_html_view


def test_calls_and_results_are_shown_and_model_text_is_escaped(tmp_path):
    call = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(6*7)"}'}}
    conversation = [
        {"role": "user", "content": "What is 6*7?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "python", "content": '{"output": "42\\n", "exit_code": 0}'},
        {"role": "assistant", "content": "<b>It is</b> \\boxed{42}"},
    ]
    jsonl = tmp_path / "groups.jsonl"
    jsonl.write_text(json.dumps({"messages": [conversation], "scores": [1.0], "tokens": [[1]], "masks": [[1]]}) + "\n")
    page = write_html_view(jsonl).read_text()
    assert "<strong>Tool call</strong> <code>python</code>" in page
    assert "print(6*7)" in page
    assert "<strong>Tool result</strong> (python)" in page and "exit_code" in page
    assert "&lt;b&gt;It is&lt;/b&gt;" in page and "<b>It is</b>" not in page
