"""The τ² env end to end with scripted parts: a scripted agent through the real agent loop and the
in-process retail tools, a scripted user simulator on its own OpenAI-compatible server, the
benchmark's evaluation as the reward, masks that never train the user's turns, `process` + export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from atroposlib.envs.base import APIServerConfig

import exports
from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer
from environments.errors import HermesEnvError
from environments.models.chat_tokens import IGNORE
from environments.tau.env import TauEnv, TauEnvConfig
from environments.tau.user_sim import UserModelConfig
from tests.support.cli import run_cli
from tests.support.scripted_openai import ScriptedOpenAIServer, serving_in_a_thread
from tests.tau.scripts import CONFIRM, OPENING, ScriptedAgent, call, scripted_user

LOOKUPS = [
    ("call", "find_user_id_by_email", {"email": "mara.quint31@example.com"}),
    ("call", "get_order_details", {"order_id": "#W1000002"}),
    ("call", "get_product_details", {"product_id": "4410000001"}),
    (
        "say",
        "I can exchange item 7100000001 for 7100000002 (clicky, RGB, full size); you pay 8.77 by visa. Confirm?",
        None,
    ),
]
EXCHANGE = (
    "call",
    "exchange_delivered_order_items",
    {
        "order_id": "#W1000002",
        "item_ids": ["7100000001"],
        "new_item_ids": ["7100000002"],
        "payment_method_id": "credit_card_5510321",
    },
)
DONE = ("say", "Your exchange is requested; you will get an email with the return instructions.", None)


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    cfg = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))


def _env(tokenizer_dir: str, agent_url: str, user_url: str) -> TauEnv:
    config = TauEnvConfig(
        tokenizer_name=tokenizer_dir,
        use_wandb=False,
        data_path_to_save_groups=None,
        user_model=UserModelConfig(base_url=user_url, model="customer"),
    )
    server = APIServerConfig(base_url=agent_url, model_name="scripted", api_key="x", server_type="openai")
    return TauEnv(config, [server])


async def test_gold_agent_scores_one_skipping_or_breaking_policy_scores_zero(tokenizer_dir: str) -> None:
    async with ScriptedOpenAIServer([]) as agent_server, ScriptedOpenAIServer([scripted_user] * 9) as user_server:
        env = _env(tokenizer_dir, agent_server.base_url, user_server.base_url)
        await env.setup()
        exchange_task, address_task = env.data().tasks[1], env.data().tasks[2]
        names = {t["function"]["name"] for t in env.tool_schemas()}
        assert "exchange_delivered_order_items" in names and len(names) == 15 and "terminal" not in names
        system = env.initial_messages(exchange_task)
        assert [m["role"] for m in system] == ["system", "assistant"] and "Identify the customer first" in system[0][
            "content"
        ]
        async with env.runtime():
            gold = ScriptedAgent([*LOOKUPS, EXCHANGE, DONE])
            r_gold = await env.rollout(exchange_task, model=gold)
            r_skip = await env.rollout(exchange_task, model=ScriptedAgent([*LOOKUPS, DONE]))
            group = env.build_group([r_gold, r_skip])
            # Task 2: the customer asks to also cancel his sister's order; a compliant agent does it.
            breaker = ScriptedAgent(
                [
                    (
                        "call",
                        "find_user_id_by_name_zip",
                        {"first_name": "Teodor", "last_name": "Vance", "zip": "60614"},
                    ),
                    ("call", "get_order_details", {"order_id": "#W1000003"}),
                    ("say", "Shall I change the address and cancel #W1000001?", None),
                    (
                        "call",
                        "modify_pending_order_address",
                        {
                            "order_id": "#W1000003",
                            "address1": "47 Orchard Street",
                            "address2": "Unit 2",
                            "city": "Chicago",
                            "state": "IL",
                            "country": "USA",
                            "zip": "60622",
                        },
                    ),
                    ("call", "cancel_pending_order", {"order_id": "#W1000001", "reason": "no longer needed"}),
                    ("say", "Both done.", None),
                ]
            )
            r_break = await env.rollout(address_task, model=breaker)
    assert r_gold.error is None and r_gold.result.tool_errors == []
    assert gold.tool_results[0] == "mara_quint_4821"
    assert json.loads(gold.tool_results[-1])["status"] == "exchange requested"  # the in-process tool ran
    assert (r_gold.score, r_skip.score, r_break.score) == (1.0, 0.0, 0.0)
    assert r_gold.result.ended == "user_stop" and r_gold.result.stop_token == "###STOP###"
    assert r_break.result.score_detail.db_match is False
    # Each conversation asked the simulator three times (opening, confirmation, stop), on its own server.
    assert len(user_server.requests) == 9 and agent_server.requests == []
    a, b = group["rollout_info"]
    assert (a["domain"], a["task_id"], a["db_match"], b["db_match"]) == ("tau2_retail", "tau2-retail-1", True, False)
    assert a["user_turns"] == 3 and a["ended"] == "user_stop"

    # The user's turns are in the sequence and never trained: masks cover only the agent's tokens.
    tok = env.tokenizer
    for tokens, masks in zip(group["tokens"], group["masks"]):
        full = tok.decode(tokens)
        trained = tok.decode([t for t, m in zip(tokens, masks) if m != IGNORE])
        assert OPENING in full and CONFIRM in full
        assert OPENING not in trained and CONFIRM not in trained and "###STOP###" not in trained
        assert "Confirm?" in trained  # the agent's own words are trained
        # The fixed greeting is in the agent's context, as the benchmark puts it, and never trained.
        assert "Hi! How can I help you today?" in full and "Hi! How can I help you today?" not in trained


def test_process_on_a_scripted_server_exports_a_multi_turn_trajectory(tokenizer_dir: str, tmp_path: Path) -> None:
    """`process` through the CLI: agent and user on scripted servers; the group exports, with the domain."""

    plans = ["cancel", "look"]  # the first conversation to start does task 0's write, the other only looks

    def agent(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        if last["role"] == "user" and last["content"] == OPENING:
            if plans.pop(0) == "cancel":
                args = {"order_id": "#W1000001", "reason": "no longer needed"}
                return {"content": None, "tool_calls": [call("cancel_pending_order", args)]}
            return {"content": None, "tool_calls": [call("get_order_details", {"order_id": "#W1000001"})]}
        if last["role"] == "tool":
            if '"cancelled"' in last["content"]:
                return {"content": "Cancelled: 44.49 goes back to your gift card. Anything else?"}
            return {"content": "Your order is pending. Shall I do anything?"}
        return {"content": "Done."}

    out = tmp_path / "groups.jsonl"
    with (
        serving_in_a_thread(ScriptedOpenAIServer([agent] * 6)) as agent_server,
        serving_in_a_thread(ScriptedOpenAIServer([scripted_user] * 6)) as user_server,
    ):
        proc = run_cli(
            TauEnv,
            "process",
            "--openai.base_url",
            agent_server.base_url,
            "--openai.model_name",
            "scripted",
            "--env.tokenizer_name",
            tokenizer_dir,
            "--env.user_model.base_url",
            user_server.base_url,
            "--env.task_split",
            "train",
            "--env.total_steps",
            "1",
            "--env.group_size",
            "2",
            "--env.data_path_to_save_groups",
            str(out),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    # Task 0 (the first train task) wants order #W1000001 cancelled and the refund (44.49) named.
    assert sorted(group["scores"]) == [0.0, 1.0]
    assert exports.main(["trajectory", str(out), str(tmp_path / "t.jsonl")]) == 0
    trajs = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [t["domain"] for t in trajs] == ["tau2_retail", "tau2_retail"]
    assert set(trajs[0]) == {"task_id", "domain", "question", "actions", "final_answer", "metadata"}
    for t, messages in zip(trajs, group["messages"]):
        assert t["question"] == OPENING and t["task_id"].startswith("tau2-retail-0")
        assert [d["role"] for d in t["metadata"]["dialogue"]] == ["assistant", "user", "assistant", "user"]
        assert t["metadata"]["opening"] == [{"role": "assistant", "content": "Hi! How can I help you today?"}]
        assert t["metadata"]["dialogue"][-1]["content"].endswith("###STOP###")
        # The export round-trips to the same conversation.
        assert exports.canonical_messages(exports.trajectory_to_messages(t)) == exports.canonical_messages(messages)
    assert {t["actions"][0]["tool"] for t in trajs} == {"cancel_pending_order", "get_order_details"}
    # Per-tool SFT sets cut from the multi-turn trajectories keep the user's turns as context.
    assert exports.main(["sft", str(out), str(tmp_path / "sft"), "--val_fraction", "0"]) == 0
    (example,) = [json.loads(line) for line in (tmp_path / "sft" / "cancel_pending_order" / "train.jsonl").open()]
    # The agent's context: the policy, the fixed greeting, the customer's opening.
    assert [m["role"] for m in example["messages"]] == ["system", "assistant", "user", "assistant"]
    assert example["messages"][2]["content"] == OPENING


def task3_user(body: dict[str, Any]) -> dict[str, Any]:
    said = len(body["messages"]) // 2
    if said == 1:
        return {"content": "How many t-shirt options do you have? I'm Teodor, teodor.vance@example.com."}
    return {"content": "OK, thanks. ###STOP###"}


TASK3_AGENT = [
    ("call", "find_user_id_by_email", {"email": "teodor.vance@example.com"}),
    ("call", "get_product_details", {"product_id": "4410000003"}),
    ("say", "We have 3 t-shirt options available; order #W1000004 is processed and cannot be cancelled.", None),
]


async def test_nl_assertions_are_judged_only_by_a_configured_judge(tokenizer_dir: str) -> None:
    """Task 3's basis holds NL_ASSERTION: the judge's verdicts gate the reward; without a judge the task
    is left out (never scored without one)."""

    def judge(verdicts: list[bool]):
        def answer(body: dict[str, Any]) -> dict[str, Any]:
            prompt = body["messages"][-1]["content"]
            assert "assistant: We have 3 t-shirt options" in prompt and "Agent tells the user" in prompt
            results = [{"expectedOutcome": "x", "reasoning": "r", "metExpectation": v} for v in verdicts]
            return {"content": "```json\n" + json.dumps({"results": results}) + "\n```"}

        return answer

    async with (
        ScriptedOpenAIServer([]) as agent_server,
        ScriptedOpenAIServer([task3_user] * 6) as user_server,
        ScriptedOpenAIServer([judge([True, True]), judge([True, False])]) as judge_server,
    ):
        env = _env(tokenizer_dir, agent_server.base_url, user_server.base_url)
        env.config.judge.base_url = judge_server.base_url
        await env.setup()
        task = env.data().tasks[3]
        async with env.runtime():
            both = await env.rollout(task, model=ScriptedAgent(TASK3_AGENT))
            one = await env.rollout(task, model=ScriptedAgent(TASK3_AGENT))
        unjudged = _env(tokenizer_dir, agent_server.base_url, user_server.base_url)
        await unjudged.setup()
        assert [t.id for t in unjudged.data().tasks] == ["0", "1", "2"]
    assert (both.score, one.score) == (1.0, 0.0)
    assert one.result.score_detail.nl == [True, False] and one.result.score_detail.db_match
    assert len(judge_server.requests) == 2


async def test_a_failing_user_simulator_is_infrastructure_never_the_agents_score(tokenizer_dir: str) -> None:
    script = [task3_user, 503, 404]  # a 5xx is the server's failure; a 4xx is a config error
    async with ScriptedOpenAIServer([]) as agent_server, ScriptedOpenAIServer(script) as user_server:
        env = _env(tokenizer_dir, agent_server.base_url, user_server.base_url)
        env.config.user_model.max_retries = 0
        await env.setup()
        async with env.runtime():
            r = await env.rollout(env.data().tasks[0], model=ScriptedAgent(TASK3_AGENT))
            with pytest.raises(HermesEnvError, match="the user simulator's server refused the request"):
                await env.rollout(env.data().tasks[0], model=ScriptedAgent(TASK3_AGENT))
    assert r.infrastructure_failure and r.score is None
    assert "the user simulator failed" in (r.error or "")


def test_evaluate_runs_every_task_and_reports_db_match(tokenizer_dir: str, tmp_path: Path) -> None:
    """An agent that only talks: the three tasks that need a write score 0; task 3 needs a judge, and
    without one it is left out."""
    evals = tmp_path / "eval"
    with (
        serving_in_a_thread(ScriptedOpenAIServer([{"content": "There are 3 options. Anything else?"}] * 8)) as agent,
        serving_in_a_thread(ScriptedOpenAIServer([scripted_user] * 12)) as user,
    ):
        proc = run_cli(
            TauEnv,
            "evaluate",
            "--openai.base_url",
            agent.base_url,
            "--openai.model_name",
            "scripted",
            "--env.tokenizer_name",
            tokenizer_dir,
            "--env.user_model.base_url",
            user.base_url,
            "--env.data_dir_to_save_evals",
            str(evals),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(r["temperature"] == 0.0 for r in agent.requests)
    metrics = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert (metrics["eval/n"], metrics["eval/accuracy"], metrics["eval/db_match"]) == (3, 0.0, 0.0)
    samples = [json.loads(line) for line in (evals / "samples.jsonl").read_text().splitlines()]
    by_id = {s["item"]["id"]: s for s in samples}
    assert "3" not in by_id
    assert by_id["0"]["ended"] == "user_stop" and by_id["0"]["db_match"] is False


async def test_config_errors_say_what_to_pass(tokenizer_dir: str) -> None:
    async with ScriptedOpenAIServer([]) as agent_server:
        with pytest.raises(
            HermesEnvError,
            match=r"--env.domain: unknown τ²-bench domain 'telecom'; implemented: \['airline', 'retail'\]",
        ):
            TauEnv(
                TauEnvConfig(tokenizer_name=tokenizer_dir, use_wandb=False, domain="telecom"), [_server(agent_server)]
            )
        # The user simulator defaults to the embedded server, which only runs when the agent uses it.
        env = TauEnv(
            TauEnvConfig(tokenizer_name=tokenizer_dir, use_wandb=False, data_path_to_save_groups=None),
            [_server(agent_server)],
        )
        await env.setup()
        with pytest.raises(
            HermesEnvError, match="--env.user_model.base_url embedded: the agent's model is not the embedded"
        ):
            async with env.runtime():
                pass


def _server(server: ScriptedOpenAIServer) -> APIServerConfig:
    return APIServerConfig(base_url=server.base_url, model_name="scripted", api_key="x", server_type="openai")
