"""What a τ²-bench domain is here: its tools as pure functions on the episode's database, and
how a database is normalised and hashed.

A tool is `fn(db, **arguments)`: it reads or changes the `db` dict in place and returns a
JSON-able answer, or raises ValueError with what was wrong (the agent sees the message). Tools
run in-process against the episode's own copy of the database: they run no model code, touch
no files and need no sandbox. `kind` is the benchmark's tool type (read / write / generic); only
writes change the database.

Domains are registered by name (`DOMAINS`: name -> module, imported on first use); a domain
module exposes `DOMAIN`. Adding telecom is one module and one line here.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["DOMAINS", "Domain", "DomainTool", "db_hash", "get_domain"]

DOMAINS = {"airline": "environments.tau.airline", "retail": "environments.tau.retail"}


@dataclass(frozen=True)
class DomainTool:
    name: str
    kind: Literal["read", "write", "generic"]
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    fn: Callable[..., Any]

    @classmethod
    def of(cls, fn: Callable[..., Any], kind: Any, description: str, props: dict[str, Any]) -> DomainTool:
        """A tool named after `fn` whose arguments are exactly `props`, all required."""
        params = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
        return cls(fn.__name__, kind, description, params, fn)


@dataclass(frozen=True)
class Domain:
    name: str
    tools: dict[str, DomainTool]
    # Fills the optional fields the published schema defaults (so a hash sees what the benchmark's
    # model_dump sees); applied to a deep copy.
    normalise: Callable[[dict[str, Any]], None] = lambda db: None
    # Functions env_assertions may name: fn(db, **arguments) -> bool.
    assertions: dict[str, Callable[..., bool]] = field(default_factory=dict)

    def load_db(self, raw: dict[str, Any]) -> dict[str, Any]:
        db = json.loads(json.dumps(raw))  # a deep copy, several times faster than copy.deepcopy on JSON data
        self.normalise(db)
        return db

    def call(self, db: dict[str, Any], name: str, arguments: dict[str, Any]) -> Any:
        """Run one tool on `db`; ValueError when the tool is unknown or refuses."""
        tool = self.tools.get(name)
        if tool is None:
            raise ValueError(f"unknown tool {name!r}; the {self.name} domain has {sorted(self.tools)}")
        try:
            return tool.fn(db, **arguments)
        except TypeError as exc:  # wrong argument names: the caller's mistake, said like a refusal
            raise ValueError(f"{name}: {exc}") from None


def db_hash(db: dict[str, Any]) -> str:
    """The database's identity: sha256 of its JSON with sorted keys (as the benchmark hashes its dump)."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, default=str).encode()).hexdigest()


def get_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise ValueError(f"unknown τ²-bench domain {name!r}; implemented: {sorted(DOMAINS)}")
    domain: Domain = importlib.import_module(DOMAINS[name]).DOMAIN
    return domain
