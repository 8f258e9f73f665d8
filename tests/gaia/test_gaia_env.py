"""The GAIA env end to end: real rollouts (workspace, attachment upload, web server, tools,
scoring) driven by the scripted solver, and `process` on the embedded llama.cpp model."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from atroposlib.envs.base import APIServerConfig

from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from environments.gaia.env import GaiaAgentEnv, GaiaAgentEnvConfig
from tests.gaia.solver import SOLVED_TASKS, GaiaScriptedSolver
from environments.models.base import ModelTurn
from slots.client import SlotState
from tests.support.scripted_openai import ScriptedOpenAIServer
from tests.support.cli import run_cli
from tests.support.embedded import embedded_model_flags, small_group_flags


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    cfg = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))


def make_env(
    tokenizer_dir: str, base_url: str, tmp_path: Path, runtime: dict[str, Any] | None = None, **overrides: Any
) -> GaiaAgentEnv:
    config = GaiaAgentEnvConfig(
        tokenizer_name=tokenizer_dir,
        use_wandb=False,
        data_path_to_save_groups=None,
        runtime={"workspace": {"workspace_root": str(tmp_path / "ws")}, **(runtime or {})},
        **overrides,
    )
    server = APIServerConfig(base_url=base_url, model_name="scripted", api_key="local", server_type="openai")
    return GaiaAgentEnv(config, [server])


class AnswerAfterSearches:
    """Searches `searches` times, then answers: a deterministic agent for reward-shape tests."""

    def __init__(self, answer: str, searches: int) -> None:
        self.answer, self.left = answer, searches

    async def chat(self, messages, tools, options) -> ModelTurn:
        if self.left:
            self.left -= 1
            call = {
                "id": f"c{uuid.uuid4().hex[:6]}",
                "type": "function",
                "function": {"name": "web_search", "arguments": json.dumps({"query": "lighthouse"})},
            }
            return ModelTurn(content=None, tool_calls=[call])
        return ModelTurn(content=f"FINAL ANSWER: {self.answer}")


async def test_scripted_solver_scores_one_on_every_offline_task(tokenizer_dir: str, tmp_path: Path) -> None:
    async with ScriptedOpenAIServer([]) as model_server:  # only answers the runtime's GET /models
        env = make_env(tokenizer_dir, model_server.base_url, tmp_path)
        await env.setup()
        assert {t["task_id"] for t in env.tasks} == set(SOLVED_TASKS)
        async with env.runtime():
            page_server = env.agent_runtime.web.base_url
            assert page_server.startswith("http://127.0.0.1:")
            solvers = {t["task_id"]: GaiaScriptedSolver(t) for t in env.tasks}
            rollouts = await asyncio.gather(*(env.rollout(t, model=solvers[t["task_id"]]) for t in env.tasks))
            group = env.build_group(list(rollouts[:2]))
        for r in rollouts:
            assert r.error is None and not r.infrastructure_failure, (r.item["task_id"], r.error)
            assert r.score == 1.0, (r.item["task_id"], r.result.final_response, r.result.messages[-3:])
            assert r.result.tool_errors == []
        # The solvers really used every toolset the env offers.
        used = {name for s in solvers.values() for name in s.calls}
        assert used >= {"python", "read_file", "terminal", "web_search", "web_extract"}
        assert [i["correct"] for i in group["rollout_info"]] == [True, True]
        assert group["rollout_info"][0]["task_id"] == rollouts[0].item["task_id"]
    # The page server stopped with the env.
    async with httpx.AsyncClient(trust_env=False) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(page_server + "wiki/lunsby.html")


async def test_attachment_is_in_the_workspace_and_named_in_the_prompt(tokenizer_dir: str, tmp_path: Path) -> None:
    async with ScriptedOpenAIServer([]) as model_server:
        env = make_env(tokenizer_dir, model_server.base_url, tmp_path, levels=[2])
        await env.setup()
        assert {t["Level"] for t in env.tasks} == {2}
        task = next(t for t in env.tasks if t["file_name"] == "colour_grid.png")
        assert "`colour_grid.png`" in env.format_prompt(task)
        assert "FINAL ANSWER" in env.initial_messages(task)[0]["content"]
        tools = {t["function"]["name"] for t in env.tool_schemas()}
        assert tools == {
            "web_search",
            "web_extract",
            "read_file",
            "write_file",
            "patch",
            "search_files",
            "python",
            "terminal",
        }
        async with env.runtime():
            # Wrong answer after reading nothing: 0, whatever the efficiency.
            wrong = await env.rollout(task, model=AnswerAfterSearches("15", 0))
            assert wrong.score == 0.0
            r = await env.rollout(task, model=GaiaScriptedSolver(task))
            assert r.score == 1.0
            slots = env.agent_runtime.tool_backend.slots()  # the default backend: sandbox slots
            assert slots and all(s.state is SlotState.FREE for s in slots)  # released (reset) after each rollout


async def test_reward_trades_correctness_against_tool_calls(tokenizer_dir: str, tmp_path: Path) -> None:
    async with ScriptedOpenAIServer([]) as model_server:
        env = make_env(tokenizer_dir, model_server.base_url, tmp_path, runtime={"loop": {"max_turns": 20}})
        await env.setup()
        task = next(t for t in env.tasks if t["task_id"] == "offline-web-lighthouse-year")
        async with env.runtime():
            frugal = await env.rollout(task, model=AnswerAfterSearches("1887", 2))
            wasteful = await env.rollout(task, model=AnswerAfterSearches("1887", 12))
            wrong = await env.rollout(task, model=AnswerAfterSearches("1888", 2))
    assert frugal.score == 1.0
    assert wasteful.score == pytest.approx(0.9 + 0.1 * (1 - (12 - 4) / (20 - 4)))
    assert wrong.score == 0.0


def test_reward_weights_must_sum_to_one() -> None:
    with pytest.raises(ValueError, match="must be 1.0"):
        GaiaAgentEnvConfig(correctness_weight=0.5, efficiency_weight=0.1)


@pytest.mark.llm
@pytest.mark.slow
def test_process_runs_offline_on_the_embedded_model(embedded_llm, tmp_path: Path) -> None:
    out = tmp_path / "gaia.jsonl"
    proc = run_cli(
        GaiaAgentEnv,
        "process",
        *embedded_model_flags(embedded_llm),
        "--env.total_steps",
        "1",
        *small_group_flags(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 1
    for group in groups:
        assert len(group["scores"]) == 2 and all(0.0 <= s <= 1.0 for s in group["scores"])
        infos = group["rollout_info"]
        assert all(i["task_id"].startswith("offline-") and isinstance(i["correct"], bool) for i in infos)
        # The model saw the GAIA system prompt and the web tools; the group says which tools it had.
        assert "FINAL ANSWER" in group["messages"][0][0]["content"]
        assert {"web_search", "web_extract", "python"} <= {t["function"]["name"] for t in group["tools"]}
        assert all(i["stop_reason"] != "context_full" for i in infos)  # the prompt with all tools fits
    # The real process output exports and round-trips.
    from exports import canonical_messages, read_conversations, sharegpt_to_messages, to_sharegpt

    conversations = list(read_conversations(out))
    assert len(conversations) == 2 and all(c.source == "process" and c.tools for c in conversations)
    for conv in conversations:
        assert canonical_messages(sharegpt_to_messages(to_sharegpt(conv))) == canonical_messages(conv.messages)


async def test_web_backend_follows_config_tavily_double(tokenizer_dir: str, tmp_path: Path) -> None:
    from pydantic import SecretStr

    from tools.web import TavilyConfig, WebConfig
    from tests.support.tavily_double import FakePage, FakeTavilyServer

    page = FakePage("https://example.org/lighthouse", "Halvorsen Point Lighthouse", "It was first lit in 1887.")
    async with FakeTavilyServer([page]) as tavily, ScriptedOpenAIServer([]) as model_server:
        web = WebConfig(
            backend="tavily", tavily=TavilyConfig(api_key=SecretStr(tavily.api_key), base_url=tavily.base_url)
        )
        env = make_env(tokenizer_dir, model_server.base_url, tmp_path, runtime={"web": web})
        await env.setup()
        task = next(t for t in env.tasks if t["task_id"] == "offline-web-lighthouse-year")
        async with env.runtime():
            r = await env.rollout(task, model=AnswerAfterSearches("1887", 1))
    assert r.score == 1.0
    tool_msg = next(m for m in r.result.messages if m["role"] == "tool")
    assert json.loads(tool_msg["content"])["results"][0]["url"] == page.url
    assert tavily.requests[0][0] == "/search" and tavily.requests[0][1]["query"] == "lighthouse"


async def test_a_web_backend_that_cannot_start_is_a_clear_error(tokenizer_dir: str, tmp_path: Path) -> None:
    from environments.hermes_base_env import HermesEnvError
    from tools.web import OfflineWebConfig, WebConfig

    (tmp_path / "empty").mkdir()
    web = WebConfig(backend="offline", offline=OfflineWebConfig(corpus_dir=str(tmp_path / "empty")))
    env = make_env(tokenizer_dir, "http://127.0.0.1:9/v1", tmp_path, runtime={"web": web})
    with pytest.raises(HermesEnvError, match="web backend could not start: .*no \\*.html pages"):
        async with env.runtime():
            pass


async def test_evaluate_saves_its_samples(tokenizer_dir: str, tmp_path: Path) -> None:
    async with ScriptedOpenAIServer([]) as model_server:
        env = make_env(
            tokenizer_dir, model_server.base_url, tmp_path, eval_size=2, data_dir_to_save_evals=str(tmp_path / "eval")
        )
        await env.setup()
        async with env.runtime(model=lambda: AnswerAfterSearches("1887", 0)):
            await env.evaluate()
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert [s["item"]["task_id"] for s in samples] == [t["task_id"] for t in env.tasks[:2]]
    assert all(s["model_answer"] == "1887" and "gold" in s and s["messages"] for s in samples)
