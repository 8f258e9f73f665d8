"""Tool registry: name -> (toolset, JSON schema, async handler, result cap).

Names are public API: a duplicate registration raises, an unknown toolset is an error
that lists the known ones. `call` never raises: whatever goes wrong becomes a JSON
string with an `error` field, because the model must always get an answer.

Arguments are checked against the tool's JSON schema (jsonschema, one validator compiled per
tool at registration) before the handler runs: a handler never acts on a guess such as the
string "no" read as true. A schema made only of flat typed properties also gets a precompiled
check that can only say "valid" (per call it allocates nothing); anything it does not accept
goes to jsonschema, which decides and words the error, so the two can never disagree.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from jsonschema import ValidationError, validators
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.protocols import Validator

from tools.context import ToolContext
from tools.executor import ToolInfrastructureError

__all__ = ["Tool", "ToolRegistry", "tool_error"]

Handler = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


def tool_error(message: str, **extra: Any) -> str:
    return json.dumps({"error": message, **extra}, ensure_ascii=False)


@dataclass(frozen=True)
class Tool:
    name: str
    toolset: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    handler: Handler
    max_result_chars: int = 20_000

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def cap_text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    dropped = len(text) - limit
    head = text[: limit // 2]
    tail = text[len(text) - (limit - len(head)) :]
    return f"{head}\n[... output truncated: {dropped} characters omitted ...]\n{tail}"


_MAX_PROBLEM_CHARS = 300  # the value a model sent is quoted in the error; it may be huge
# jsonschema says "is too long" without the limit; the model needs the limit to fix its call.
_BOUNDS = {
    "maxItems": "at most {} items",
    "minItems": "at least {} items",
    "maxLength": "at most {} characters",
    "minLength": "at least {} characters",
}


# JSON Schema's primitive types as Python checks (bool is not a number; 1.0 is an integer).
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: type(v) is str,
    "boolean": lambda v: type(v) is bool,
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
    "number": lambda v: type(v) is int or type(v) is float,
}
_ANNOTATIONS = frozenset({"description", "title", "examples", "$comment"})  # keywords that never reject


def _fast_check(schema: dict[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """A check for a schema of flat typed properties that says True only when jsonschema would;
    None when the schema has anything else (then jsonschema alone decides)."""
    if not set(schema) <= {"type", "properties", "required"} | _ANNOTATIONS or schema.get("type", "object") != "object":
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    typed: list[tuple[str, Callable[[Any], bool]]] = []
    for key, sub in properties.items():
        if not isinstance(sub, dict) or not set(sub) <= {"type"} | _ANNOTATIONS:
            return None
        if "type" in sub:
            is_type = _TYPE_CHECKS.get(sub["type"]) if isinstance(sub["type"], str) else None
            if is_type is None:
                return None
            typed.append((key, is_type))
    needed = tuple(required)
    checks = tuple(typed)
    if not needed and not checks:  # accepts any object: nothing to check per call
        return lambda arguments: True

    def check(arguments: dict[str, Any]) -> bool:
        for key in needed:
            if key not in arguments:
                return False
        for key, ok in checks:
            if key in arguments and not ok(arguments[key]):
                return False
        return True

    return check


def _argument_error(name: str, error: ValidationError) -> str:
    """One line: the tool, the argument (a path for nested values) and what is wrong with it."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    problem = error.message.replace("\n", " ")
    if len(problem) > _MAX_PROBLEM_CHARS:  # the value comes first, what is wrong with it last
        half = _MAX_PROBLEM_CHARS // 2
        problem = f"{problem[:half]}…{problem[-half:]}"
    if bound := _BOUNDS.get(str(error.validator)):
        problem += f" ({bound.format(error.validator_value)})"
    where = f"argument '{path}': " if path else ""
    return f"{name}: {where}{problem}; call it again with arguments that match its schema"


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = (), *, checked: ToolRegistry | None = None) -> None:
        """`checked`: a registry whose tools' schemas are already checked and compiled; a tool with the same
        name and parameters reuses that (checking a schema is most of the cost of registering a tool, and
        an env builds one registry per conversation to bind handlers to the episode's state)."""
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, Validator] = {}
        self._fast: dict[str, Callable[[dict[str, Any]], bool] | None] = {}
        for tool in tools:
            self.register(tool, checked=checked)

    def register(self, tool: Tool, *, checked: ToolRegistry | None = None) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered (toolset {self._tools[tool.name].toolset!r})")
        known = checked._tools.get(tool.name) if checked is not None else None
        if checked is not None and known is not None and known.parameters == tool.parameters:
            # Validators are immutable: sharing one between registries is safe.
            self._validators[tool.name] = checked._validators[tool.name]
            self._fast[tool.name] = checked._fast[tool.name]
            self._tools[tool.name] = tool
            return
        cls = validators.validator_for(tool.parameters)
        try:
            cls.check_schema(tool.parameters)
        except SchemaError as exc:  # the tool's author must fix it; said at startup, not to the model
            raise ValueError(f"tool {tool.name!r} has an invalid parameters schema: {exc.message}") from None
        self._validators[tool.name] = cls(tool.parameters)
        self._fast[tool.name] = _fast_check(tool.parameters)
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def toolsets(self) -> frozenset[str]:
        return frozenset(t.toolset for t in self._tools.values())

    def select(
        self,
        enabled_toolsets: Iterable[str] | None = None,
        disabled_toolsets: Iterable[str] | None = None,
    ) -> list[Tool]:
        """Tools of the enabled toolsets (all when None) minus the disabled ones."""
        enabled = None if enabled_toolsets is None else set(enabled_toolsets)
        disabled = set(disabled_toolsets or ())
        unknown = ((enabled or set()) | disabled) - self.toolsets
        if unknown:
            raise ValueError(f"unknown toolset(s) {sorted(unknown)}; known toolsets: {sorted(self.toolsets)}")
        return [
            t for t in self._tools.values() if (enabled is None or t.toolset in enabled) and t.toolset not in disabled
        ]

    def definitions(
        self,
        enabled_toolsets: Iterable[str] | None = None,
        disabled_toolsets: Iterable[str] | None = None,
    ) -> list[dict[str, Any]]:
        return [t.schema() for t in self.select(enabled_toolsets, disabled_toolsets)]

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | str | None,
        context: ToolContext,
        allowed: Iterable[str] | None = None,
    ) -> str:
        """Run one tool call; always returns the string the model will see."""
        tool = self._tools.get(name)
        if allowed is not None and not isinstance(allowed, (set, frozenset)):
            allowed = frozenset(allowed)  # a caller calling often passes a set it built once
        if tool is None or (allowed is not None and name not in allowed):
            known = sorted(allowed) if allowed is not None else sorted(self._tools)
            return tool_error(f"unknown tool {name!r}; available tools: {known}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return tool_error(
                    f"arguments of {name!r} are not valid JSON ({exc.msg} at position {exc.pos}); send a JSON object"
                )
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return tool_error(f"arguments of {name!r} must be a JSON object, got {type(arguments).__name__}")
        fast = self._fast[name]
        if fast is None or not fast(arguments):
            missing = [p for p in tool.parameters.get("required", []) if p not in arguments]
            if missing:
                return tool_error(f"{name!r} is missing required argument(s) {missing}")
            validator = self._validators[name]
            if not validator.is_valid(arguments):
                return tool_error(_argument_error(name, best_match(validator.iter_errors(arguments))))
        try:
            result = await tool.handler(arguments, context)
        except ToolInfrastructureError:
            raise  # a broken sandbox voids the trajectory; the model must not be blamed for it
        except Exception as exc:  # a tool failure is the model's information, not a crash
            return tool_error(f"{name} failed: {type(exc).__name__}: {exc}")
        return cap_text(result, tool.max_result_chars)
