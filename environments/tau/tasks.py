"""τ²-bench task files and data directories, in the benchmark's published layout.

    <data_dir>/domains/<domain>/db.json            the domain's database
    <data_dir>/domains/<domain>/policy.md          the agent's policy (its system prompt)
    <data_dir>/domains/<domain>/tasks.json         a JSON array of tasks
    <data_dir>/domains/<domain>/split_tasks.json   optional: split name -> task ids (train/test/base)
    <data_dir>/user_simulator/simulation_guidelines.md   the user simulator's guidelines

`data_dir` is the benchmark's `data/tau2` directory (its repository's `data/` works too). A task
is `{id, description, user_scenario: {persona, instructions}, initial_state, evaluation_criteria:
{actions, env_assertions, communicate_info, nl_assertions, reward_basis}}`; `instructions` is an
object (`domain, reason_for_call, known_info, unknown_info, task_instructions`) or a string.
Fields the benchmark added for other purposes (issues, ticket, ...) are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "BUNDLED_DATA_DIR",
    "Action",
    "DomainData",
    "EvaluationCriteria",
    "RewardType",
    "Task",
    "load_domain_data",
    "resolve_data_dir",
]

BUNDLED_DATA_DIR = Path(__file__).resolve().parent / "data" / "tau2"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RewardType(str, Enum):
    DB = "DB"
    ENV_ASSERTION = "ENV_ASSERTION"
    NL_ASSERTION = "NL_ASSERTION"
    ACTION = "ACTION"
    COMMUNICATE = "COMMUNICATE"


class Action(_Model):
    action_id: str
    requestor: Literal["user", "assistant"] = "assistant"
    name: str
    arguments: dict[str, Any]
    info: str | None = None
    compare_args: list[str] | None = None  # None: every argument of the call is compared

    def matches(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether a tool call does this action: same name, equal values on the compared arguments."""
        if name != self.name:
            return False
        keys = list(arguments) if self.compare_args is None else self.compare_args
        return {k: arguments[k] for k in keys if k in arguments} == {
            k: self.arguments[k] for k in keys if k in self.arguments
        }


class EnvCall(_Model):
    env_type: Literal["user", "assistant"]
    func_name: str
    arguments: dict[str, Any]


class EnvAssertion(EnvCall):
    assert_value: bool = True
    message: str | None = None


class EvaluationCriteria(_Model):
    actions: list[Action] | None = None
    env_assertions: list[EnvAssertion] | None = None
    communicate_info: list[str] | None = None
    nl_assertions: list[str] | None = None
    reward_basis: list[RewardType] = Field(default_factory=lambda: [RewardType.DB, RewardType.COMMUNICATE])


class Instructions(_Model):
    domain: str
    reason_for_call: str
    known_info: str | None = None
    unknown_info: str | None = None
    task_instructions: str

    def text(self) -> str:
        parts = [f"Domain: {self.domain}", f"Reason for call:\n\t{self.reason_for_call}"]
        if self.known_info is not None:
            parts.append(f"Known info:\n\t{self.known_info}")
        if self.unknown_info is not None:
            parts.append(f"Unknown info:\n\t{self.unknown_info}")
        parts.append(f"Task instructions:\n\t{self.task_instructions}")
        return "\n".join(parts)


class UserScenario(_Model):
    persona: str | None = None
    instructions: Instructions | str

    def text(self) -> str:
        instructions = self.instructions if isinstance(self.instructions, str) else self.instructions.text()
        persona = f"Persona:\n\t{self.persona}\n" if self.persona else ""
        return f"{persona}Instructions:\n{instructions}"


class InitializationData(_Model):
    agent_data: dict[str, Any] | None = None
    user_data: dict[str, Any] | None = None


class InitialState(_Model):
    initialization_data: InitializationData | None = None
    initialization_actions: list[EnvCall] | None = None
    message_history: list[dict[str, Any]] | None = None


class Task(_Model):
    id: str
    description: dict[str, Any] | None = None
    user_scenario: UserScenario
    initial_state: InitialState | None = None
    evaluation_criteria: EvaluationCriteria | None = None


@dataclass(frozen=True)
class DomainData:
    name: str
    policy: str
    db: dict[str, Any]  # as published; the domain normalises a copy per episode
    tasks: list[Task]
    user_guidelines: str


def resolve_data_dir(data_dir: Path) -> Path:
    """The directory holding `domains/`: `data/tau2` itself, or the repository's `data/`."""
    for candidate in (data_dir, data_dir / "tau2", data_dir / "data" / "tau2"):
        if (candidate / "domains").is_dir():
            return candidate
    raise ValueError(f"{data_dir} has no domains/ directory; pass tau2-bench's data/tau2 directory")


def load_domain_data(data_dir: Path, domain: str, split: str | None = None) -> DomainData:
    """A domain's policy, database and tasks (those of `split` when given); a ValueError says what is wrong."""
    root = resolve_data_dir(data_dir)
    where = root / "domains" / domain
    if not where.is_dir():
        known = sorted(p.name for p in (root / "domains").iterdir() if p.is_dir())
        raise ValueError(f"{root}/domains has no {domain!r} domain; it has {known}")
    try:
        policy = (where / "policy.md").read_text(encoding="utf-8")
        db = json.loads((where / "db.json").read_text(encoding="utf-8"))
        raw_tasks = json.loads((where / "tasks.json").read_text(encoding="utf-8"))
        guidelines = (root / "user_simulator" / "simulation_guidelines.md").read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ValueError(f"{where}: missing {Path(exc.filename).name} (the published layout has it)") from None
    if not isinstance(raw_tasks, list):
        raise ValueError(f"{where}/tasks.json is not a JSON array of tasks")
    tasks = []
    for n, raw in enumerate(raw_tasks):
        try:
            tasks.append(Task.model_validate(raw))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{where}/tasks.json task {n}: {loc}: {first['msg']}") from None
    if split is not None:
        splits_file = where / "split_tasks.json"
        if not splits_file.is_file():
            raise ValueError(f"{where} has no split_tasks.json; drop --env.task_split to use every task")
        splits = json.loads(splits_file.read_text(encoding="utf-8"))
        if split not in splits:
            raise ValueError(f"{splits_file} has splits {sorted(splits)}, not {split!r}")
        wanted = set(splits[split])
        tasks = [t for t in tasks if t.id in wanted]
    if not tasks:
        raise ValueError(f"{where}/tasks.json has no tasks" + (f" in split {split!r}" if split else ""))
    return DomainData(domain, policy, db, tasks, guidelines)
