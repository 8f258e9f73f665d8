"""The exports under model-controlled text: what a model writes (its prose, its tool calls' names and
arguments, what its tools print) is data in every file made from a run.

- the HTML view `process` writes beside its groups shows model text as text (no markup, no script,
  no `javascript:` link runs in the reader's browser);
- a tool name the model made up never becomes a path outside the SFT output directory;
- JSONL cannot be split or forged by line breaks and record-looking text in a model answer, and a
  conversation survives every export format byte for byte.
"""

from __future__ import annotations

from tests.support.embedded import embedded_tokenizer
import json
from pathlib import Path
from typing import Any

from exports import build_tool_sft, main, read_conversations, to_trajectory
from tests.support.cli import run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread, tool_call
from tests.support.tiny_env import WriteWordEnv

HOSTILE = (
    '<script>alert("xss")</script> <img src=x onerror=alert(1)> [click](javascript:alert(2)) '
    '<iframe src=//evil.example></iframe> <a href="javascript:alert(3)">a</a>'
)


def test_the_html_view_shows_model_text_as_text(tmp_path: Path) -> None:
    arguments = json.dumps({"path": "answer.txt", "content": HOSTILE})

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] == "user":
            return {"content": f"writing {HOSTILE}", "tool_calls": [tool_call("write_file", arguments)]}
        return {"content": f"done {HOSTILE}"}

    out = tmp_path / "groups.jsonl"
    with serving_in_a_thread(ScriptedOpenAIServer([reply] * 4)) as server:
        run = run_cli(
            WriteWordEnv, "process", "--env.group_size", "2", "--env.total_steps", "1",
            "--openai.base_url", server.base_url, "--openai.model_name", "scripted",
            "--env.tokenizer_name", embedded_tokenizer(), "--env.data_path_to_save_groups", str(out),
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    page = out.with_suffix(".html").read_text().lower()
    for live in ("<script>alert", "<img src=x", "<iframe", 'href="javascript:', "href='javascript:"):
        assert live not in page, live
    assert "&lt;script&gt;alert" in page and "[click](javascript:alert(2))" in page  # there, as text


def _conversation(tool: str) -> dict[str, Any]:
    return {
        "prompt_id": f"p-{tool}",
        "messages": [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "calling",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": tool, "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "fine"},
            {"role": "assistant", "content": "done"},
        ],
    }


def test_a_made_up_tool_name_never_leaves_the_sft_directory(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    names = ["../escaped", "../../escaped2", str(outside), ".", "..", "a/b", "x\x00y", "terminal"]
    source = tmp_path / "runs.jsonl"
    source.write_text("".join(json.dumps(_conversation(n)) + "\n" for n in names))
    out = tmp_path / "deep" / "sft"
    trajectories = [to_trajectory(c) for c in read_conversations(source)]
    manifest = build_tool_sft(trajectories, out, val_fraction=0.0)
    assert set(manifest) == {"terminal"}  # the one real tool name
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {
        "runs.jsonl",
        "deep/sft/manifest.json",
        "deep/sft/terminal/train.jsonl",
        "deep/sft/terminal/val.jsonl",
    }
    assert main(["sft", str(source), str(tmp_path / "cli_sft")]) == 0
    assert not outside.exists() and not (tmp_path / "escaped").exists()


def test_jsonl_cannot_be_split_or_forged_by_model_text(tmp_path: Path) -> None:
    forged = '"}]}\n{"prompt_id": "forged", "messages": []}\n'
    breaks = "a\nb\rc\r\nd\u2028e\u2029f\x85g\x0bh\x0ci\x1cj" + forged
    row = _conversation("terminal")
    row["messages"][1]["content"] = breaks
    row["messages"][2]["content"] = breaks
    row["messages"][3]["content"] = breaks
    source = tmp_path / "runs.jsonl"
    source.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    for fmt in ("sharegpt", "openai", "trajectory"):
        target = tmp_path / f"{fmt}.jsonl"
        assert main([fmt, str(source), str(target)]) == 0
        lines = target.read_bytes().decode("utf-8").split("\n")
        assert lines[-1] == "" and len(lines) == 2, fmt  # one record, one line
        assert json.dumps(json.loads(lines[0])).count(json.dumps(breaks)[1:-1]) >= 2, fmt
    (conv,) = read_conversations(source)
    assert [m.get("content") for m in conv.messages[1:]] == [breaks] * 3
