"""The `web` toolset: `web_search` and `web_extract`, answered by a backend chosen by config.

    backend = make_web_backend(WebConfig())          # offline engine unless a Tavily key is set
    await backend.start()
    registry = ToolRegistry([*builtin_tools(), *web_tools(backend)])
    ...
    await backend.stop()

The handlers get their backend by closure, so two envs can run different backends in
one process.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from tools.context import ToolContext
from tools.registry import Tool, tool_error
from tools.web.base import ExtractedPage, ExtractResult, FailedExtract, SearchHit, WebBackend, WebBackendError
from tools.web.offline import BUNDLED_CORPUS, OfflineWebConfig, OfflineWebEngine
from tools.web.tavily import TavilyClient, TavilyConfig
from tools.web.text import html_to_text

__all__ = [
    "WebConfig",
    "WebBackend",
    "WebBackendError",
    "SearchHit",
    "ExtractedPage",
    "ExtractResult",
    "FailedExtract",
    "OfflineWebConfig",
    "OfflineWebEngine",
    "TavilyConfig",
    "TavilyClient",
    "BUNDLED_CORPUS",
    "html_to_text",
    "make_web_backend",
    "web_tools",
]

_MAX_RESULTS = 10
_MAX_URLS = 5


class WebConfig(BaseModel):
    backend: Literal["auto", "offline", "tavily"] = Field(
        "auto", description="'auto': Tavily when a key is configured, else the offline engine"
    )
    offline: OfflineWebConfig = Field(default_factory=OfflineWebConfig)
    tavily: TavilyConfig = Field(default_factory=TavilyConfig)


def make_web_backend(config: WebConfig) -> WebBackend:
    kind = config.backend
    if kind == "auto":
        kind = "tavily" if config.tavily.resolved_key() is not None else "offline"
    if kind == "tavily":
        return TavilyClient(config.tavily)
    return OfflineWebEngine(config.offline)


def web_tools(backend: WebBackend) -> list[Tool]:
    """The two web tools, bound to `backend` (which the caller starts and stops)."""

    async def web_search(args: dict[str, Any], ctx: ToolContext) -> str:
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return tool_error("'query' must be a non-empty string")
        limit = args.get("max_results", 5)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_RESULTS:
            return tool_error(f"'max_results' must be an integer from 1 to {_MAX_RESULTS}, got {limit!r}")
        try:
            hits = await backend.search(query.strip(), limit)
        except WebBackendError as exc:
            return tool_error(str(exc))
        payload: dict[str, Any] = {
            "query": query,
            "results": [{"title": h.title, "url": h.url, "snippet": h.snippet} for h in hits],
        }
        if not hits:
            payload["note"] = "no results; try other or fewer words"
        return json.dumps(payload, ensure_ascii=False)

    async def web_extract(args: dict[str, Any], ctx: ToolContext) -> str:
        urls = args.get("urls")
        if isinstance(urls, str):  # a lone URL is an easy mistake to forgive
            urls = [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u for u in urls):
            return tool_error("'urls' must be a non-empty list of URL strings")
        if len(urls) > _MAX_URLS:
            return tool_error(f"at most {_MAX_URLS} URLs per call, got {len(urls)}; split them over several calls")
        try:
            result = await backend.extract(list(dict.fromkeys(urls)))
        except WebBackendError as exc:
            return tool_error(str(exc))
        payload: dict[str, Any] = {
            "results": [{"url": p.url, "title": p.title, "content": p.content} for p in result.pages]
        }
        if result.failed:
            payload["failed"] = [{"url": f.url, "error": f.error} for f in result.failed]
        return json.dumps(payload, ensure_ascii=False)

    return [
        Tool(
            name="web_search",
            toolset="web",
            description="Search the web. Returns titles, URLs and snippets; read a page with web_extract.",
            parameters={
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to search for."},
                    "max_results": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": _MAX_RESULTS,
                        "description": "Number of results (default 5).",
                    },
                },
                "required": ["query"],
            },
            handler=web_search,
        ),
        Tool(
            name="web_extract",
            toolset="web",
            description="Fetch web pages and return their readable text (long pages are truncated).",
            parameters={
                "type": "object",
                "properties": {
                    "urls": {
                        "type": ["array", "string"],  # a lone URL is an easy mistake to forgive
                        "items": {"type": "string"},
                        "maxItems": _MAX_URLS,
                        "description": "URLs to read (or one URL), e.g. from web_search results.",
                    },
                },
                "required": ["urls"],
            },
            handler=web_extract,
            max_result_chars=40_000,
        ),
    ]
