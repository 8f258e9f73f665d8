"""The seam between the web tools and whatever answers them (offline engine or Tavily)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["SearchHit", "ExtractedPage", "FailedExtract", "ExtractResult", "WebBackend", "WebBackendError"]


class WebBackendError(Exception):
    """The search/extract service could not answer (unreachable, refused the key, rate limited)."""


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str
    score: float


@dataclass(frozen=True)
class ExtractedPage:
    url: str
    title: str
    content: str  # readable text, already capped


@dataclass(frozen=True)
class FailedExtract:
    url: str
    error: str


@dataclass(frozen=True)
class ExtractResult:
    pages: list[ExtractedPage]
    failed: list[FailedExtract]


@runtime_checkable
class WebBackend(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def search(self, query: str, max_results: int) -> list[SearchHit]: ...

    async def extract(self, urls: list[str]) -> ExtractResult: ...
