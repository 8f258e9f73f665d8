"""Offline web engine latency (run by hand).

    .venv/bin/python -m bench.offline_web [--n 200]

Measures web_search (FTS5 on the engine's DB thread) and web_extract (HTTP fetch of a
corpus page + HTML-to-text) per call, against a baseline measured in the same run: a
bare SQLite FTS5 query on the main thread and a bare HTTP GET of the same page.
"""

from __future__ import annotations

from bench.machine import load_note

import argparse
import asyncio
import time

import httpx

from tools.web import OfflineWebEngine


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    n = parser.parse_args().n
    async with OfflineWebEngine() as engine:
        url = engine.base_url + "wiki/halvorsen_point_lighthouse.html"
        db = engine._db  # baseline only: the same index, queried directly
        assert db is not None
        t0 = time.perf_counter()
        for _ in range(n):
            db.execute("SELECT path FROM pages WHERE pages MATCH ? LIMIT 5", ('"lighthouse" OR "lit"',)).fetchall()
        bare_query = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(n):
            await engine.search("when was the lighthouse first lit", 5)
        search = (time.perf_counter() - t0) / n
        async with httpx.AsyncClient(trust_env=False) as client:
            t0 = time.perf_counter()
            for _ in range(n):
                await client.get(url)
            bare_get = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(n):
            await engine.extract([url])
        extract = (time.perf_counter() - t0) / n
    print(
        f"web_search : {search * 1e3:7.3f} ms/call  (bare FTS5 query {bare_query * 1e3:.3f} ms; ratio {search / bare_query:5.1f}x)"
    )
    print(
        f"web_extract: {extract * 1e3:7.3f} ms/call  (bare HTTP GET   {bare_get * 1e3:.3f} ms; ratio {extract / bare_get:5.1f}x)"
    )


if __name__ == "__main__":
    print(load_note(), flush=True)  # idle or loaded: how to read the ratios below
    asyncio.run(main())
