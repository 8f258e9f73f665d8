"""An embedded offline web: SQLite FTS5 over a corpus of HTML pages, served over real HTTP.

`start()` indexes every `*.html` under the corpus directory and serves the directory on
127.0.0.1 (an ephemeral port by default). Search hits carry the served URLs, and
`extract` fetches them over HTTP like any page, so the agent sees a small web with the
same shape as the real one. URLs outside this server are refused: there is no network.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import httpx
from aiohttp import web
from pydantic import BaseModel, Field

from tools.web.base import ExtractedPage, ExtractResult, FailedExtract, SearchHit, WebBackendError
from tools.web.text import html_to_text

__all__ = ["OfflineWebConfig", "OfflineWebEngine", "BUNDLED_CORPUS"]

BUNDLED_CORPUS = Path(__file__).with_name("corpus")


class OfflineWebConfig(BaseModel):
    kind: Literal["offline"] = "offline"
    corpus_dir: str = Field(str(BUNDLED_CORPUS), description="Directory of *.html pages to index and serve")
    host: str = Field("127.0.0.1", description="Address the page server binds")
    port: int = Field(0, ge=0, le=65535, description="Port of the page server (0: any free port)")
    max_extract_chars: int = Field(8_000, gt=0, description="Cap on the text of one extracted page")
    fetch_timeout_s: float = Field(10.0, gt=0)


def _fts_query(query: str) -> str:
    """Free text -> an FTS5 expression: any of the words, each quoted (no syntax errors)."""
    words = re.findall(r"\w+", query.lower())
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


class OfflineWebEngine:
    def __init__(self, config: OfflineWebConfig | None = None) -> None:
        self.config = config or OfflineWebConfig()
        # SQLite calls are blocking; one worker thread owns the connection on purpose.
        self._db_pool: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None
        self._runner: web.AppRunner | None = None
        self._http: httpx.AsyncClient | None = None
        self.base_url = ""

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        root = Path(self.config.corpus_dir)
        if not root.is_dir():
            raise FileNotFoundError(
                f"offline web corpus {str(root)!r} is not a directory; set OfflineWebConfig.corpus_dir"
            )
        self._db_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offline-web-db")
        loop = asyncio.get_running_loop()
        count = await loop.run_in_executor(self._db_pool, self._build_index, root)
        if count == 0:
            raise FileNotFoundError(f"offline web corpus {str(root)!r} has no *.html pages")
        app = web.Application()
        app.router.add_static("/", root, show_index=False, follow_symlinks=False)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}/"
        self._http = httpx.AsyncClient(timeout=self.config.fetch_timeout_s, trust_env=False)

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._db_pool is not None:
            if self._db is not None:
                await asyncio.get_running_loop().run_in_executor(self._db_pool, self._db.close)
                self._db = None
            self._db_pool.shutdown(wait=True)
            self._db_pool = None
        self.base_url = ""

    async def __aenter__(self) -> "OfflineWebEngine":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- index (runs on the db thread) -------------------------------------------------
    def _build_index(self, root: Path) -> int:
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.execute("CREATE VIRTUAL TABLE pages USING fts5(path UNINDEXED, title, body, tokenize='porter unicode61')")
        count = 0
        for page in sorted(root.rglob("*.html")):
            title, body = html_to_text(page.read_text(encoding="utf-8"))
            db.execute("INSERT INTO pages VALUES (?, ?, ?)", (page.relative_to(root).as_posix(), title, body))
            count += 1
        db.commit()
        self._db = db
        return count

    def _query(self, expr: str, limit: int) -> list[tuple[str, str, str, float]]:
        assert self._db is not None
        # Title matches weigh more than body matches (bm25 column weights).
        return self._db.execute(
            "SELECT path, title, snippet(pages, 2, '', '', ' ... ', 32), bm25(pages, 0.0, 5.0, 1.0) AS rank "
            "FROM pages WHERE pages MATCH ? ORDER BY rank LIMIT ?",
            (expr, limit),
        ).fetchall()

    # -- WebBackend ----------------------------------------------------------------------
    async def search(self, query: str, max_results: int) -> list[SearchHit]:
        if self._db_pool is None or not self.base_url:
            raise WebBackendError("offline web engine is not started; start it with the env")
        expr = _fts_query(query)
        if not expr:
            return []
        rows = await asyncio.get_running_loop().run_in_executor(self._db_pool, self._query, expr, max_results)
        return [SearchHit(title=t, url=self.base_url + p, snippet=s, score=round(-r, 4)) for p, t, s, r in rows]

    async def extract(self, urls: list[str]) -> ExtractResult:
        if self._http is None:
            raise WebBackendError("offline web engine is not started; start it with the env")
        results = await asyncio.gather(*(self._fetch(u) for u in urls))
        pages = [r for r in results if isinstance(r, ExtractedPage)]
        failed = [r for r in results if isinstance(r, FailedExtract)]
        return ExtractResult(pages=pages, failed=failed)

    async def _fetch(self, url: str) -> ExtractedPage | FailedExtract:
        assert self._http is not None
        if not url.startswith(self.base_url):
            return FailedExtract(
                url,
                f"offline web: only pages of the offline corpus ({self.base_url}...) are reachable; use a URL from web_search results",
            )
        try:
            response = await self._http.get(url)
        except httpx.HTTPError as exc:
            return FailedExtract(url, f"fetch failed: {type(exc).__name__}: {exc}")
        if response.status_code != 200:
            return FailedExtract(url, f"HTTP {response.status_code}")
        title, text = html_to_text(response.text, self.config.max_extract_chars)
        return ExtractedPage(url=url, title=title, content=text)
