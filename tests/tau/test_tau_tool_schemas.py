"""The tool list a τ² model is offered, pinned: each domain's schemas, in order, exactly as the env hands
them to the model (tests/tau/tool_schemas.json, written from the tables before the descriptions moved into
the tools' docstrings). A changed description, parameter or order changes what every policy is prompted with
and must be a deliberate edit of the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from environments.tau.conversation import domain_tools
from environments.tau.domain import DOMAINS, DomainTool, get_domain
from tools.registry import ToolRegistry

PINNED = json.loads((Path(__file__).parent / "tool_schemas.json").read_text())


def test_every_domain_is_pinned() -> None:
    assert sorted(PINNED) == sorted(DOMAINS)


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_offered_tool_schemas_are_unchanged(name: str) -> None:
    offered = ToolRegistry(domain_tools(get_domain(name), None)).definitions()
    assert offered == PINNED[name]


def test_a_tool_is_described_by_its_whole_docstring_and_refused_without_one() -> None:
    def wrapped(db: dict[str, Any], x: str) -> str:
        """Look something
        up.

        Then say so."""
        return x

    def bare(db: dict[str, Any]) -> str:
        return ""

    def blank(db: dict[str, Any]) -> str:
        """ """
        return ""

    assert DomainTool.of(wrapped, "read", {"x": {"type": "string"}}).description == "Look something up.\n\nThen say so."
    assert (
        DomainTool.confirmed(wrapped, {}).description
        == "Look something up.\n\nThen say so. Needs explicit confirmation."
    )
    for undocumented in (bare, blank):
        with pytest.raises(ValueError, match=f"^tool .*{undocumented.__name__} has no docstring: write what the model"):
            DomainTool.of(undocumented, "read", {})
