"""`tool_choice` as the OpenAI chat API has it: `auto`, `none`, `required`, or a named function.

    auto      the model decides (no constraint)
    none      the model writes no tool call
    required  the model calls one or more of the offered tools
    {"type": "function", "function": {"name": "python"}}   the model calls that tool

Chat mode sends the value as it is (OpenAI, vLLM and llama.cpp servers constrain the turn
themselves); token mode constrains the sampling with a grammar built from the tool schemas
and the parser family's markup (environments/models/token_mode/constrain.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["FunctionName", "NamedToolChoice", "ToolChoice", "check_tool_choice", "offered_tools", "wire_value"]


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: this tool must be called."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["function"] = "function"
    function: FunctionName


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


def wire_value(choice: ToolChoice) -> str | dict[str, Any]:
    """The value as an OpenAI request carries it."""
    return choice.model_dump() if isinstance(choice, NamedToolChoice) else choice


def offered_tools(tools: list[dict[str, Any]], choice: ToolChoice) -> list[dict[str, Any]]:
    """The tools a call may name under `choice` (all of them, or the named one); ValueError for a
    name that is not offered, or a call required with no tool offered."""
    if isinstance(choice, NamedToolChoice):
        named = [t for t in tools if t.get("function", {}).get("name") == choice.function.name]
        if not named:
            known = ", ".join(t.get("function", {}).get("name", "?") for t in tools) or "none"
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not offered (offered: {known})")
        return named
    if choice == "required" and not tools:
        raise ValueError("tool_choice 'required' with no tool offered")
    return tools


def check_tool_choice(
    choices: list[ToolChoice | None], token_protocol: str | None, tools_in: str, extra_body: dict[str, Any]
) -> None:
    """ValueError, in one line, for a tool_choice the way of talking to the server cannot carry
    (checked before any rollout). `token_protocol` None: chat mode."""
    constrained = sorted({str(wire_value(c)) for c in choices if c is not None and c != "auto"})
    if not constrained:
        return
    said = " and ".join(constrained)
    if token_protocol is not None and token_protocol != "llamacpp":
        raise ValueError(
            f"tool_choice {said} in token mode needs the llamacpp protocol (a sampling grammar), not "
            f"{token_protocol}; use chat mode (--env.runtime.token_server off) with a server that takes tool_choice, "
            "or tool_choice auto"
        )
    # Where a grammar is sent: token mode, and chat mode with the tools in the system prompt.
    grammar_sent = token_protocol is not None or tools_in == "system_prompt"
    if grammar_sent and {"grammar", "json_schema"} & extra_body.keys():
        raise ValueError(
            f"tool_choice {said} constrains sampling with its own grammar; remove grammar/json_schema from "
            "--env.runtime.extra_body or use tool_choice auto"
        )
