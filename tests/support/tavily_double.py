"""FakeTavilyServer: a test double of Tavily's REST API on 127.0.0.1.

It follows Tavily's documented shapes: `POST /search` takes `{query, max_results,
search_depth, include_answer, ...}` and answers `{query, answer, images, results:
[{title, url, content, score, raw_content}], response_time}`; `POST /extract` takes
`{urls, extract_depth, format, ...}` and answers `{results: [{url, raw_content, images}],
failed_results: [{url, error}], response_time}`. Both require `Authorization: Bearer <key>`
and answer 401 `{"detail": {"error": ...}}` otherwise. Pages are given as data; search
scores them by word overlap. Every request body is recorded for assertions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["FakeTavilyServer", "FakePage"]


@dataclass(frozen=True)
class FakePage:
    url: str
    title: str
    text: str


@dataclass
class FakeTavilyServer:
    pages: list[FakePage]
    api_key: str = "tvly-test-key"
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    fail_next: int | None = None  # answer the next request with this HTTP status
    base_url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/search", self._search)
        app.router.add_post("/extract", self._extract)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> "FakeTavilyServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _guard(self, request: web.Request, path: str) -> dict[str, Any] | web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401)
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"detail": {"error": "Invalid JSON body"}}, status=400)
        self.requests.append((path, body))
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            return web.json_response({"detail": {"error": f"simulated error {status}"}}, status=status)
        return body

    async def _search(self, request: web.Request) -> web.Response:
        body = await self._guard(request, "/search")
        if isinstance(body, web.Response):
            return body
        query = body.get("query")
        if not isinstance(query, str) or not query:
            return web.json_response({"detail": {"error": "Query is missing."}}, status=400)
        words = set(re.findall(r"\w+", query.lower()))
        scored = []
        for page in self.pages:
            page_words = re.findall(r"\w+", f"{page.title} {page.text}".lower())
            overlap = len(words & set(page_words))
            if overlap:
                scored.append((overlap / max(len(words), 1), page))
        scored.sort(key=lambda s: -s[0])
        max_results = int(body.get("max_results", 5))
        results = [
            {
                "title": p.title,
                "url": p.url,
                "content": p.text[:300],
                "score": round(s, 4),
                "raw_content": p.text if body.get("include_raw_content") else None,
            }
            for s, p in scored[:max_results]
        ]
        return web.json_response(
            {
                "query": query,
                "follow_up_questions": None,
                "answer": None,
                "images": [],
                "results": results,
                "response_time": 0.01,
            }
        )

    async def _extract(self, request: web.Request) -> web.Response:
        body = await self._guard(request, "/extract")
        if isinstance(body, web.Response):
            return body
        urls = body.get("urls")
        if isinstance(urls, str):
            urls = [urls]
        if not isinstance(urls, list) or not urls:
            return web.json_response({"detail": {"error": "urls is missing."}}, status=400)
        by_url = {p.url: p for p in self.pages}
        results, failed = [], []
        for url in urls:
            page = by_url.get(url)
            if page is None:
                failed.append({"url": url, "error": "Failed to fetch url"})
            else:
                results.append({"url": url, "raw_content": page.text, "images": []})
        return web.json_response({"results": results, "failed_results": failed, "response_time": 0.01})
