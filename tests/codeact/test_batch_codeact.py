"""batch_runner with `--agent codeact`: smolagents' CodeAgent over a real (scripted) OpenAI server; the SFT
records and their ShareGPT export keep the code actions the model wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("smolagents")

from batch_runner import BatchConfig, parse_args, run_batch  # noqa: E402
from exports import read_conversations, to_sharegpt  # noqa: E402
from tests.support.scripted_openai import ScriptedOpenAIServer  # noqa: E402

FIRST = "Thought: compute it.\n<code>\nn = 6 * 7\nprint('n is', n)\n</code>"
SECOND = "Thought: done.\n<code>\nfinal_answer(n)\n</code>"


def coder(body: dict[str, Any]) -> dict[str, Any]:
    seen = "\n".join(str(m.get("content")) for m in body["messages"])
    return {"content": SECOND if "n is 42" in seen else FIRST}


async def test_batch_runner_runs_the_code_agent_and_keeps_code_actions(tmp_path: Path) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(json.dumps({"prompt": "What is six times seven?", "id": "p1", "toolsets": ["python"]}) + "\n")
    async with ScriptedOpenAIServer([coder, coder]) as server:
        config = BatchConfig(
            dataset_file=dataset,
            run_name="t",
            model="scripted",
            base_url=server.base_url,
            output_dir=tmp_path / "runs",
            agent="codeact",
        )
        await run_batch(config)
    (record,) = [json.loads(line) for line in (tmp_path / "runs/t/trajectories.jsonl").read_text().splitlines()]
    assert record["final_answer"] == 42 and record["stop_reason"] == "finished"
    assert record["code_actions"] == ["n = 6 * 7\nprint('n is', n)", "final_answer(n)"]
    assert record["messages"][-1] == {"role": "assistant", "content": SECOND}
    (conversation,) = list(read_conversations(tmp_path / "runs/t/trajectories.jsonl"))
    turns = to_sharegpt(conversation)["conversations"]
    assert [t["value"] for t in turns if t["from"] == "gpt"] == [FIRST, SECOND]
    assert any("n is 42" in t["value"] for t in turns if t["from"] == "human")


def test_agent_flag() -> None:
    assert parse_args(["--dataset_file", "x", "--run_name", "r", "--agent", "codeact"]).agent == "codeact"
