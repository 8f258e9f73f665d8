"""Tools over one task's own documents: an item's paragraphs (toolset `paragraphs`) and a
video's timestamped captions (toolset `captions`).

The env writes the documents into the trajectory's workspace before the agent starts
(`write_paragraphs` / `write_captions`); the handlers read them back through the tool
context, so they work on every tool backend and never see another trajectory's item (nor
its answer, which is never written).

    search_paragraphs(query)          -> titles ranked by word overlap, with a snippet
    open_paragraph(title)             -> the paragraph's sentences, numbered from 0
    search_captions(query)            -> caption lines containing the query's words
    read_captions(start_s, end_s)     -> caption lines overlapping [start_s, end_s]
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from tools.context import ToolContext
from tools.registry import Tool, tool_error

__all__ = [
    "PARAGRAPHS_FILE",
    "CAPTIONS_FILE",
    "Caption",
    "ParagraphIndex",
    "parse_captions",
    "paragraph_tools",
    "caption_tools",
    "write_paragraphs",
    "write_captions",
]

PARAGRAPHS_FILE = ".task/paragraphs.json"
CAPTIONS_FILE = ".task/captions.json"
_MAX_RESULTS = 10
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an the of in on at to and or is was were are by for with from what which who whom how".split())


def _words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def _joined(sentences: list[str]) -> str:
    return " ".join(s.strip() for s in sentences)  # HotpotQA's sentences after the first start with a space


async def write_paragraphs(ctx: ToolContext, paragraphs: list[dict[str, Any]]) -> None:
    await ctx.write_file(PARAGRAPHS_FILE, json.dumps(paragraphs, ensure_ascii=False))


def _limit(args: dict[str, Any]) -> int:
    return int(args.get("max_results", 5))


_LIMIT_SCHEMA = {"type": "integer", "minimum": 1, "maximum": _MAX_RESULTS, "description": "Results (default 5)."}


class ParagraphIndex:
    """Paragraphs `{title, sentences}` with their words counted once, searched by word overlap."""

    def __init__(self, paragraphs: Sequence[dict[str, Any]]) -> None:
        self.paragraphs = list(paragraphs)
        self._words = [(set(_words(p["title"])), _words(_joined(p["sentences"]))) for p in self.paragraphs]
        self._by_title: dict[str, list[dict[str, Any]]] = {}
        for p in self.paragraphs:
            self._by_title.setdefault(p["title"].lower(), []).append(p)

    def search(self, query: set[str], limit: int) -> list[dict[str, str]]:
        """Title words count double; ties keep the paragraphs' order."""
        scored = []
        for n, (title, text) in enumerate(self._words):
            score = 2 * len(query & title) + sum(w in query for w in text)
            if score:
                scored.append((-score, n))
        hits = [self.paragraphs[n] for _, n in sorted(scored)[:limit]]
        return [{"title": p["title"], "snippet": _joined(p["sentences"])[:160]} for p in hits]

    def open(self, title: str) -> list[dict[str, Any]]:
        return self._by_title.get(title.strip().lower(), [])


def paragraph_tools(corpus: Callable[[], ParagraphIndex] | None = None) -> list[Tool]:
    """The `paragraphs` toolset over the trajectory's own paragraphs (`write_paragraphs`), or over the
    shared index `corpus()` returns (fullwiki style: every paragraph of the data set) when given."""

    async def index(ctx: ToolContext) -> ParagraphIndex:
        if corpus is not None:
            return corpus()
        return ParagraphIndex(json.loads(await ctx.read_file(PARAGRAPHS_FILE)))

    async def search_paragraphs(args: dict[str, Any], ctx: ToolContext) -> str:
        query = set(_words(args["query"]))
        if not query:
            return tool_error("'query' has no searchable words; name people, places or things from the question")
        results = (await index(ctx)).search(query, _limit(args))
        payload: dict[str, Any] = {"query": args["query"], "results": results}
        if not results:
            payload["note"] = "no paragraph matches; try other words"
        return json.dumps(payload, ensure_ascii=False)

    async def open_paragraph(args: dict[str, Any], ctx: ToolContext) -> str:
        found = (await index(ctx)).open(args["title"])
        if not found:
            return tool_error(f"no paragraph titled {args['title']!r}; find titles with search_paragraphs")
        return json.dumps(
            [
                {"title": p["title"], "sentences": [f"[{i}] {s.strip()}" for i, s in enumerate(p["sentences"])]}
                for p in found
            ],
            ensure_ascii=False,
        )

    return [
        Tool(
            name="search_paragraphs",
            toolset="paragraphs",
            description="Search the paragraphs. Returns titles with a snippet; read one with open_paragraph.",
            parameters={
                "type": "object",
                "properties": {"query": {"type": "string", "minLength": 1}, "max_results": _LIMIT_SCHEMA},
                "required": ["query"],
            },
            handler=search_paragraphs,
        ),
        Tool(
            name="open_paragraph",
            toolset="paragraphs",
            description="Read a paragraph by its title; its sentences are numbered [0], [1], ... for citations.",
            parameters={
                "type": "object",
                "properties": {"title": {"type": "string", "minLength": 1}},
                "required": ["title"],
            },
            handler=open_paragraph,
        ),
    ]


# ---- captions ------------------------------------------------------------------------------

_CAPTION = re.compile(r"^\s*\[\s*(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)\s*\]\s*(.*\S)\s*$")


class Caption(NamedTuple):
    start: float  # seconds
    end: float
    text: str

    @property
    def line(self) -> str:
        return f"[{self.start:g}-{self.end:g}] {self.text}"


def parse_captions(text: str, where: str = "captions") -> list[Caption]:
    """`[start-end] text` lines (seconds); blank lines are skipped, anything else is an error."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        m = _CAPTION.match(line)
        if m is None:
            raise ValueError(f"{where} line {n} is not '[start-end] text' (seconds): {line[:80]!r}")
        out.append(Caption(float(m.group(1)), float(m.group(2)), m.group(3)))
    return out


async def write_captions(ctx: ToolContext, captions: list[Caption]) -> None:
    await ctx.write_file(CAPTIONS_FILE, json.dumps([list(c) for c in captions], ensure_ascii=False))


async def _captions(ctx: ToolContext) -> list[Caption]:
    return [Caption(float(s), float(e), str(t)) for s, e, t in json.loads(await ctx.read_file(CAPTIONS_FILE))]


async def _read_captions(args: dict[str, Any], ctx: ToolContext) -> str:
    start, end = float(args["start_s"]), float(args["end_s"])
    if end < start:
        return tool_error(f"end_s {end:g} is before start_s {start:g}; pass a window with start_s <= end_s")
    captions = await _captions(ctx)
    lines = [c.line for c in captions if c.end >= start and c.start <= end]
    duration = max((c.end for c in captions), default=0.0)
    return json.dumps({"window": [start, end], "duration_s": duration, "captions": lines}, ensure_ascii=False)


async def _search_captions(args: dict[str, Any], ctx: ToolContext) -> str:
    query = set(_words(args["query"]))
    if not query:
        return tool_error("'query' has no searchable words")
    ranked = [(len(query & set(_words(c.text))), c) for c in await _captions(ctx)]
    hits = sorted((r for r in ranked if r[0]), key=lambda r: -r[0])[: _limit(args)]
    return json.dumps({"query": args["query"], "results": [c.line for _, c in hits]}, ensure_ascii=False)


def caption_tools() -> list[Tool]:
    return [
        Tool(
            name="read_captions",
            toolset="captions",
            description="Read the video's captions between start_s and end_s (seconds).",
            parameters={
                "type": "object",
                "properties": {"start_s": {"type": "number", "minimum": 0}, "end_s": {"type": "number", "minimum": 0}},
                "required": ["start_s", "end_s"],
            },
            handler=_read_captions,
        ),
        Tool(
            name="search_captions",
            toolset="captions",
            description="Find caption lines that mention the query's words; returns '[start-end] text' lines.",
            parameters={
                "type": "object",
                "properties": {"query": {"type": "string", "minLength": 1}, "max_results": _LIMIT_SCHEMA},
                "required": ["query"],
            },
            handler=_search_captions,
        ),
    ]
