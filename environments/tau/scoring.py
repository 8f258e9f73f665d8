"""τ²-bench's evaluation of one conversation, reimplemented from its documented behaviour.

- A conversation that did not end by the user's stop token (or the agent's stop) scores 0.
- A task without evaluation criteria scores 1.
- DB: the gold actions are replayed on a fresh copy of the task's initial database (errors
  ignored, as the benchmark's replay ignores them); the agent's final database must hash the
  same. A policy-breaking write the tools allowed, a skipped write or a write with other
  arguments all change the hash.
- ENV_ASSERTION: each assertion, a domain function on the final database, must return its
  `assert_value`.
- COMMUNICATE: each `communicate_info` string must occur, case-insensitively, in an assistant
  message's text with commas removed.
- ACTION: each gold action must match some tool call (same name; equal `compare_args`, or all
  arguments the call has when `compare_args` is null).
- NL_ASSERTION: verdicts of a judge model (environments/tau/user_sim.py); a task without
  assertions scores 1 on it. Scoring a task whose basis has NL_ASSERTION and which has assertions
  without verdicts raises (the benchmark raises too): such a task is never scored without a judge.

The reward is the product over the task's `reward_basis` of these components (each 1 or 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from environments.tau.domain import Domain, db_hash
from environments.tau.tasks import RewardType, Task

__all__ = [
    "ENDED_BY_STOP",
    "GoldHashes",
    "TauScore",
    "gold_db",
    "initial_db",
    "needs_judge",
    "score_episode",
    "tool_calls",
]

# How a conversation may end and still be scored (the benchmark's AGENT_STOP / USER_STOP).
ENDED_BY_STOP = frozenset({"user_stop", "agent_stop"})


@dataclass
class TauScore:
    reward: float
    db_match: bool | None = None
    db_hash: str | None = None  # the final database's, when db_match compared it with the gold one's
    actions: list[bool] = field(default_factory=list)
    communicate: list[bool] = field(default_factory=list)
    env_assertions: list[bool] = field(default_factory=list)
    nl: list[bool] | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    note: str | None = None


def needs_judge(task: Task) -> bool:
    """Whether scoring `task` takes a judge's verdicts: NL_ASSERTION in its basis, and assertions to judge."""
    criteria = task.evaluation_criteria
    return bool(criteria and RewardType.NL_ASSERTION in criteria.reward_basis and criteria.nl_assertions)


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def tool_calls(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of every tool call the agent made, in order; unparseable arguments as {}."""
    out = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    args = {}
            out.append((str(fn.get("name")), args if isinstance(args, dict) else {}))
    return out


def initial_db(task: Task, domain: Domain, base: dict[str, Any]) -> dict[str, Any]:
    """The database a task starts from: the domain's, updated by the task's initial state."""
    db = domain.load_db(base)
    state = task.initial_state
    if state is None:
        return db
    if state.initialization_data is not None and state.initialization_data.agent_data:
        _merge(db, json.loads(json.dumps(state.initialization_data.agent_data)))
        domain.normalise(db)
    for action in state.initialization_actions or []:
        if action.env_type == "assistant":
            domain.call(db, action.func_name, action.arguments)
    for name, args in tool_calls(state.message_history or []):  # earlier turns' writes
        tool = domain.tools.get(name)
        if tool is not None and tool.kind == "write":
            try:
                domain.call(db, name, args)
            except ValueError:
                pass
    return db


def gold_db(task: Task, domain: Domain, base: dict[str, Any]) -> dict[str, Any]:
    """The task's initial database after its gold actions (a refused action changes nothing)."""
    db = initial_db(task, domain, base)
    criteria = task.evaluation_criteria
    for action in (criteria.actions or []) if criteria else []:
        if action.requestor != "assistant":
            continue  # user tools: none in the implemented domains
        try:
            domain.call(db, action.name, action.arguments)
        except ValueError:
            pass
    return db


class GoldHashes:
    """The hash of each task's gold database, replayed once per task: the rollouts of a group (or of an
    evaluation's repeats) share it. For one domain and one base database, which nobody changes."""

    def __init__(self, domain: Domain, base_db: dict[str, Any]) -> None:
        self.domain, self.base_db = domain, base_db
        # By the task object's id; the task is kept, so that id cannot be another task's while it is here.
        self._hashes: dict[int, tuple[Task, str]] = {}

    def of(self, task: Task) -> str:
        known = self._hashes.get(id(task))
        if known is None:  # two threads may both replay a new task: the same hash, stored twice
            known = self._hashes[id(task)] = (task, db_hash(gold_db(task, self.domain, self.base_db)))
        return known[1]


def _agent_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m.get("role") == "assistant" and isinstance(m.get("content"), str)]


def score_episode(
    task: Task,
    domain: Domain,
    base_db: dict[str, Any],
    final_db: dict[str, Any],
    messages: list[dict[str, Any]],
    *,
    ended: str,
    nl_verdicts: list[bool] | None = None,
    gold: GoldHashes | None = None,
) -> TauScore:
    """Score one conversation: `base_db` is the domain's database (before the task's initial state),
    `final_db` the agent's database at the end, `ended` how the conversation ended; `gold` keeps the
    gold databases' hashes of `domain` and `base_db` from one call to the next."""
    if gold is None:
        gold = GoldHashes(domain, base_db)
    elif gold.domain is not domain or gold.base_db is not base_db:
        raise ValueError("these GoldHashes are another domain's or database's; make one per domain and database")
    if ended not in ENDED_BY_STOP:
        return TauScore(0.0, note=f"the conversation did not end by a stop token ({ended})")
    criteria = task.evaluation_criteria
    if criteria is None:
        return TauScore(1.0, note="the task has no evaluation criteria")
    score = TauScore(1.0)

    if criteria.actions is not None or criteria.env_assertions is not None:
        score.db_hash = db_hash(final_db)
        score.db_match = gold.of(task) == score.db_hash
    else:
        score.db_match = True
    for assertion in criteria.env_assertions or []:
        fn = domain.assertions.get(assertion.func_name)
        met = fn is not None and bool(fn(final_db, **assertion.arguments)) == assertion.assert_value
        score.env_assertions.append(met)

    texts = [t.lower().replace(",", "") for t in _agent_texts(messages)]
    score.communicate = [any(info.lower() in t for t in texts) for info in criteria.communicate_info or []]

    calls = tool_calls(messages)
    score.actions = [any(a.matches(name, args) for name, args in calls) for a in criteria.actions or []]

    if criteria.nl_assertions and nl_verdicts is not None:
        if len(nl_verdicts) != len(criteria.nl_assertions):
            raise ValueError(f"{len(nl_verdicts)} verdicts for {len(criteria.nl_assertions)} NL assertions")
        score.nl = list(nl_verdicts)
    elif needs_judge(task):
        raise ValueError(f"task {task.id} scores on NL_ASSERTION and no judge's verdicts were given")
    elif not criteria.nl_assertions:
        score.nl = []

    components = {
        RewardType.DB: float(bool(score.db_match)),
        RewardType.ENV_ASSERTION: float(all(score.env_assertions)),
        RewardType.COMMUNICATE: float(all(score.communicate)),
        RewardType.ACTION: float(all(score.actions)),
    }
    if score.nl is not None:
        components[RewardType.NL_ASSERTION] = float(all(score.nl))
    for kind in criteria.reward_basis:
        if kind in components:
            score.breakdown[kind.value] = components[kind]
            score.reward *= components[kind]
    return score
