"""What a τ²-bench domain is here: its tools as pure functions on the episode's database, and
how a database is normalised and hashed.

A tool is `fn(db, **arguments)`: it reads or changes the `db` dict in place and returns a
JSON-able answer, or raises ValueError with what was wrong (the agent sees the message); its
docstring is the description the model reads, as in the benchmark's toolkits. Tools
run in-process against the episode's own copy of the database: they run no model code, touch
no files and need no sandbox. `kind` is the benchmark's tool type (read / write / generic); only
writes change the database.

Domains are registered by name (`DOMAINS`: name -> module, imported on first use); a domain
module exposes `DOMAIN`. Adding telecom is one module and one line here.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = ["CALCULATE", "DOMAINS", "TRANSFER_TO_HUMAN_AGENTS", "Domain", "DomainTool", "db_hash", "get_domain"]

DOMAINS = {"airline": "environments.tau.airline", "retail": "environments.tau.retail"}


@dataclass(frozen=True)
class DomainTool:
    name: str
    kind: Literal["read", "write", "generic"]
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    fn: Callable[..., Any]

    @classmethod
    def of(cls, fn: Callable[..., Any], kind: Any, props: dict[str, Any]) -> DomainTool:
        """A tool named after `fn`, described by its docstring, whose arguments are exactly `props`, all
        required."""
        params = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
        return cls(fn.__name__, kind, _description(fn), params, fn)

    @classmethod
    def confirmed(cls, fn: Callable[..., Any], props: dict[str, Any]) -> DomainTool:
        """A write the policy allows only after the user's explicit yes; its description ends saying so."""
        tool = cls.of(fn, "write", props)
        return replace(tool, description=f"{tool.description} Needs explicit confirmation.")


def _description(fn: Callable[..., Any]) -> str:
    """What the model reads about a tool: all of `fn`'s docstring, as the benchmark sends all of its tools'
    docstrings (but their argument sections, which here are the schemas). A line break inside a paragraph is
    only source wrapping and reads as a space; paragraphs stay apart. ValueError for a tool without one."""
    doc = inspect.cleandoc(fn.__doc__ or "")
    if not doc:
        raise ValueError(f"tool {fn.__qualname__} has no docstring: write what the model should know about it there")
    return "\n\n".join(" ".join(p.split("\n")) for p in doc.split("\n\n"))


@dataclass(frozen=True)
class Domain:
    name: str
    toolkit: str  # the benchmark's toolkit class, which its argument errors name
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
        except ValueError:
            raise
        except Exception as exc:  # wrong argument names or types: said as the benchmark says them
            text = str(exc)
            if text.startswith(f"{name}()"):  # the benchmark's tools are methods of its toolkit class
                text = f"{self.toolkit}.{text}"
            raise ValueError(text) from None


# ---- the generic tools every domain has (the benchmark declares them alike in each) ---------------

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_MAX_EXPONENT = 10_000  # the benchmark evaluates `9**9**9` (and never returns); here it is refused


# What the benchmark's `eval` of an expression over digits, + - * / ( ) . and spaces gives, rounded to cents;
# its exceptions' own messages (`division by zero`, `invalid syntax (<string>, line 1)`).
def calculate(db: dict[str, Any], expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / and parentheses); the result to 2 decimals."""
    if not all(c in "0123456789+-*/(). " for c in expression):
        raise ValueError("Invalid characters in expression")

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        raise ValueError("Invalid expression")  # e.g. `()` or `(1)(2)`: not arithmetic

    try:
        return str(round(float(value(ast.parse(expression, filename="<string>", mode="eval").body)), 2))
    except (SyntaxError, ArithmeticError, TypeError) as exc:
        raise ValueError(str(exc)) from None


def transfer_to_human_agents(db: dict[str, Any], summary: str) -> str:
    """Hand the user to a human agent with a summary of the issue; only when the user asks for one, or the
    policy and tools cannot solve the issue."""
    return "Transfer successful"


_S = {"type": "string"}
CALCULATE = DomainTool.of(calculate, "generic", {"expression": _S})
TRANSFER_TO_HUMAN_AGENTS = DomainTool.of(transfer_to_human_agents, "generic", {"summary": _S})


def db_hash(db: dict[str, Any]) -> str:
    """The database's identity: sha256 of its JSON with sorted keys (as the benchmark hashes its dump)."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, default=str).encode()).hexdigest()


def get_domain(name: str) -> Domain:
    if name not in DOMAINS:
        raise ValueError(f"unknown τ²-bench domain {name!r}; implemented: {sorted(DOMAINS)}")
    domain: Domain = importlib.import_module(DOMAINS[name]).DOMAIN
    return domain
