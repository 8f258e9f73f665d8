"""The template env (environments/examples/count_files.py): its `process` on the embedded model,
and rollouts with an injected model and no HTTP server at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from environments.examples.count_files import CountFilesEnv
from environments.models.base import ModelTurn
from tests.support.cli import run_cli
from tests.support.embedded import embedded_model_flags


class CountingAgent:
    """Runs `ls | wc -l` in its workspace, then answers what the tool printed (plus `off`)."""

    def __init__(self, off: int = 0) -> None:
        self.off = off

    async def chat(self, messages, tools, options) -> ModelTurn:
        assert [t["function"]["name"] for t in tools] == ["terminal"]
        if messages[-1]["role"] != "tool":
            call = {"function": {"name": "terminal", "arguments": json.dumps({"command": "ls | wc -l"})}}
            return ModelTurn(content=None, tool_calls=[call])
        counted = int(json.loads(messages[-1]["content"])["output"].strip())
        return ModelTurn(content=str(counted + self.off))


def make_env(tmp_path: Path) -> CountFilesEnv:
    config, servers = CountFilesEnv.config_init()
    config.data_path_to_save_groups = str(tmp_path / "groups.jsonl")
    return CountFilesEnv(config, servers)


async def test_injected_model_scores_through_the_workspace_without_a_server(tmp_path):
    env = make_env(tmp_path)
    await env.setup()
    items = [await env.get_next_item() for _ in range(3)]
    assert items == [1, 2, 3]  # the default get_next_item walks items() in order
    async with env.runtime(model=CountingAgent):
        right = [await env.rollout(n) for n in items]
        wrong = await env.rollout(4, model=CountingAgent(off=1))
        group, backlog = await env.collect_trajectories(5)
    assert [r.score for r in right] == [1.0, 1.0, 1.0] and wrong.score == 0.0
    assert right[2].result.final_response == "3"
    assert backlog == [] and group["scores"] == [1.0, 1.0]
    assert env.agent_runtime.mode == "injected"


@pytest.mark.llm
@pytest.mark.slow
def test_process_runs_on_the_embedded_model(embedded_llm, tmp_path):
    out = tmp_path / "groups.jsonl"
    config = tmp_path / "config.yaml"
    # A grammar keeps the tiny model's answer a single digit; llama.cpp then wants tools in the prompt.
    config.write_text(
        yaml.safe_dump({"env": {"runtime": {"extra_body": {"grammar": "root ::= [1-9]"}, "tools_in": "system_prompt"}}})
    )
    proc = run_cli(
        CountFilesEnv,
        "process",
        "--config",
        str(config),
        *embedded_model_flags(embedded_llm),
        "--env.total_steps",
        "2",
        "--env.group_size",
        "2",
        "--env.ensure_scores_are_not_same=False",
        "--env.data_path_to_save_groups",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2
    for files, group in enumerate(groups, 1):  # items 1, 2, ... in order: group n has n files
        assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 2
        for messages, score in zip(group["messages"], group["scores"]):
            assert "How many files are in your workspace?" in messages[0]["content"]
            answer = messages[-1]["content"]
            assert answer in "123456789" and score == (1.0 if answer == str(files) else 0.0)


@pytest.mark.llm
@pytest.mark.slow
def test_a_required_first_turn_exercises_the_env_tools_on_the_embedded_model(embedded_llm, tmp_path):
    """What `first_turn_tool_choice` (default `required` on the embedded model) gives a new env's
    author: rollouts whose first turn runs the env's tool in its workspace, shown in the HTML view."""
    out = tmp_path / "groups.jsonl"
    proc = run_cli(
        CountFilesEnv,
        "process",
        *embedded_model_flags(embedded_llm),
        "--env.runtime.token_server",
        "llamacpp",  # the fixture's server, in token mode as the embedded default runs it
        "--env.runtime.loop.first_turn_tool_choice",
        "required",
        "--env.total_steps",
        "2",
        "--env.group_size",
        "2",
        "--env.runtime.loop.max_turns",
        "2",
        "--env.runtime.loop.max_tokens",
        "96",
        "--env.ensure_scores_are_not_same=False",
        "--env.data_path_to_save_groups",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rollouts = [m for line in out.read_text().splitlines() for m in json.loads(line)["messages"]]
    assert len(rollouts) == 4
    answered = 0
    for messages in rollouts:
        at = next(i for i, m in enumerate(messages) if m["role"] == "assistant")  # the constrained first turn
        first = messages[at]
        if first.get("tool_calls"):  # else the call's arguments ran past the token cap
            assert first["tool_calls"][0]["function"]["name"] == "terminal"
            result = messages[at + 1]
            assert result["role"] == "tool" and result["tool_call_id"] == first["tool_calls"][0]["id"]
            answered += 1
    assert answered >= 1
    page = out.with_suffix(".html").read_text()
    assert "<strong>Tool call</strong> <code>terminal</code>" in page and "<strong>Tool result</strong>" in page
