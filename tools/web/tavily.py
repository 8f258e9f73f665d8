"""Thin adapter over Tavily's REST API (POST /search, POST /extract, Bearer key).

Only the request and response fields this project uses are read; everything else in
Tavily's answers is ignored. The key is a `SecretStr` and is never logged.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field, SecretStr

from tools.web.base import ExtractedPage, ExtractResult, FailedExtract, SearchHit, WebBackendError
from tools.web.text import cap_chars

__all__ = ["TavilyConfig", "TavilyClient", "TAVILY_KEY_ENV"]

TAVILY_KEY_ENV = "TAVILY_API_KEY"


class TavilyConfig(BaseModel):
    kind: Literal["tavily"] = "tavily"
    api_key: SecretStr | None = Field(None, description=f"Tavily API key (default: ${TAVILY_KEY_ENV})")
    base_url: str = Field("https://api.tavily.com", description="Tavily API root")
    search_depth: Literal["basic", "advanced"] = "basic"
    extract_depth: Literal["basic", "advanced"] = "basic"
    timeout_s: float = Field(30.0, gt=0)
    max_extract_chars: int = Field(8_000, gt=0, description="Cap on the text of one extracted page")

    def resolved_key(self) -> SecretStr | None:
        """The configured key, else the one in the environment (the only place it is read)."""
        if self.api_key is not None:
            return self.api_key
        value = os.environ.get(TAVILY_KEY_ENV)
        return SecretStr(value) if value else None


_STATUS_HINTS = {
    400: "Tavily rejected the request as malformed",
    401: "Tavily rejected the API key; check TavilyConfig.api_key or $" + TAVILY_KEY_ENV,
    429: "Tavily rate limit reached; retry later or lower concurrency",
    432: "Tavily plan limit reached; upgrade the plan or wait for the quota to reset",
    433: "Tavily pay-as-you-go limit reached",
}


class TavilyClient:
    def __init__(self, config: TavilyConfig) -> None:
        self.config = config
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        key = self.config.resolved_key()
        if key is None:
            raise WebBackendError(
                f"no Tavily API key: set TavilyConfig.api_key or ${TAVILY_KEY_ENV}, or use the offline web backend"
            )
        self._http = httpx.AsyncClient(
            base_url=self.config.base_url,
            timeout=self.config.timeout_s,
            headers={"Authorization": f"Bearer {key.get_secret_value()}", "Content-Type": "application/json"},
        )

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> "TavilyClient":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._http is None:
            raise WebBackendError("Tavily client is not started; start it with the env")
        try:
            response = await self._http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise WebBackendError(f"Tavily {path} unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            hint = _STATUS_HINTS.get(response.status_code, "Tavily returned an error")
            raise WebBackendError(f"{hint} (HTTP {response.status_code} on {path}): {response.text[:300]}")
        try:
            data = response.json()
        except ValueError as exc:
            raise WebBackendError(f"Tavily {path} answered with non-JSON: {response.text[:200]!r}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise WebBackendError(f"Tavily {path} answer has no 'results' list: {str(data)[:200]}")
        return data

    async def search(self, query: str, max_results: int) -> list[SearchHit]:
        data = await self._post(
            "/search",
            {
                "query": query,
                "max_results": max_results,
                "search_depth": self.config.search_depth,
                "include_answer": False,
                "include_raw_content": False,
                "include_images": False,
            },
        )
        return [
            SearchHit(
                title=str(r.get("title", "")),
                url=str(r.get("url", "")),
                snippet=str(r.get("content", "")),
                score=float(r.get("score") or 0.0),
            )
            for r in data["results"]
        ]

    async def extract(self, urls: list[str]) -> ExtractResult:
        data = await self._post(
            "/extract",
            {"urls": urls, "extract_depth": self.config.extract_depth, "format": "text", "include_images": False},
        )
        pages = [
            ExtractedPage(
                url=str(r.get("url", "")),
                title=str(r.get("title") or ""),
                content=cap_chars(str(r.get("raw_content") or ""), self.config.max_extract_chars),
            )
            for r in data["results"]
        ]
        failed = [
            FailedExtract(url=str(f.get("url", "")), error=str(f.get("error", "failed")))
            for f in data.get("failed_results") or []
        ]
        return ExtractResult(pages=pages, failed=failed)
