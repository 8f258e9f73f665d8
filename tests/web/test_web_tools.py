"""Web tools against real components: the FTS5 engine, its HTTP page server, and a Tavily double over HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from model_tools import builtin_tools
from tools.context import ToolContext
from tools.executor import LocalWorkspace
from tools.registry import ToolRegistry
from tools.web import (
    OfflineWebConfig,
    OfflineWebEngine,
    TavilyClient,
    TavilyConfig,
    WebBackendError,
    WebConfig,
    html_to_text,
    make_web_backend,
    web_tools,
)
from tests.support.tavily_double import FakePage, FakeTavilyServer


def test_html_to_text_keeps_content_and_drops_chrome() -> None:
    html = """<html><head><title> My  Page </title><style>p{color:red}</style>
    <script>var secret = "do-not-show";</script></head><body>
    <nav>Home | About</nav><h1>Heading</h1><p>First   paragraph
    continues.</p><ul><li>one</li><li>two</li></ul>
    <table><tr><th>k</th><th>v</th></tr><tr><td>height</td><td>31 m</td></tr></table>
    <p>Caf&eacute; &amp; bar</p><footer>copyright</footer></body></html>"""
    title, text = html_to_text(html)
    assert title == "My Page"
    assert text.splitlines() == [
        "# Heading",
        "First paragraph continues.",
        "- one",
        "- two",
        "k | v",
        "height | 31 m",
        "Café & bar",
    ]
    assert "do-not-show" not in text and "color" not in text and "copyright" not in text and "About" not in text


def test_html_to_text_caps_size_and_says_so() -> None:
    _, text = html_to_text("<p>" + "word " * 1000 + "</p>", max_chars=100)
    assert text.startswith("word word")
    assert len(text) < 160 and "truncated" in text


@pytest.fixture
async def engine():
    async with OfflineWebEngine(OfflineWebConfig(max_extract_chars=4000)) as e:
        yield e


async def test_offline_search_ranks_the_right_page_and_serves_it_over_http(engine: OfflineWebEngine) -> None:
    hits = await engine.search("When was Halvorsen Point Lighthouse first lit?", 5)
    assert hits[0].url == engine.base_url + "wiki/halvorsen_point_lighthouse.html"
    assert hits[0].title.startswith("Halvorsen Point Lighthouse")
    assert engine.base_url.startswith("http://127.0.0.1:")
    # The page is really served: an independent HTTP client can fetch the raw HTML.
    async with httpx.AsyncClient(trust_env=False) as client:
        raw = await client.get(hits[0].url)
    assert raw.status_code == 200 and "<table>" in raw.text
    result = await engine.extract([hits[0].url])
    assert result.failed == []
    page = result.pages[0]
    assert "first lit in 1887" in page.content
    assert "Tower height | 31 metres" in page.content
    assert "tracking-code" not in page.content and "offline edition" not in page.content


async def test_offline_search_survives_fts_syntax_and_stemming(engine: OfflineWebEngine) -> None:
    assert await engine.search('"moons" AND NOT (orvane* -x:', 3)  # no FTS5 syntax error
    assert await engine.search("!!!", 3) == []
    stemmed = await engine.search("moon discoveries", 3)  # porter stemming: "moon" finds "Moons"
    assert stemmed[0].url.endswith("wiki/planet_orvane.html")


async def test_offline_extract_refuses_other_hosts_and_reports_missing_pages(engine: OfflineWebEngine) -> None:
    result = await engine.extract(
        ["https://example.com/", engine.base_url + "wiki/nope.html", engine.base_url + "wiki/lunsby.html"]
    )
    assert [p.url for p in result.pages] == [engine.base_url + "wiki/lunsby.html"]
    errors = {f.url: f.error for f in result.failed}
    assert "only pages of the offline corpus" in errors["https://example.com/"]
    assert errors[engine.base_url + "wiki/nope.html"] == "HTTP 404"


async def test_offline_extract_caps_page_size(tmp_path: Path) -> None:
    (tmp_path / "big.html").write_text("<title>Big</title><p>" + "lorem ipsum " * 2000 + "</p>")
    async with OfflineWebEngine(OfflineWebConfig(corpus_dir=str(tmp_path), max_extract_chars=500)) as e:
        (page,) = (await e.extract([e.base_url + "big.html"])).pages
    assert len(page.content) < 600 and "truncated" in page.content


async def test_offline_engine_stops_its_server() -> None:
    e = OfflineWebEngine()
    await e.start()
    url = e.base_url
    await e.stop()
    async with httpx.AsyncClient(trust_env=False) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(url + "wiki/lunsby.html")
    with pytest.raises(WebBackendError, match="not started"):
        await e.search("lunsby", 3)


async def test_offline_engine_refuses_an_empty_corpus(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no \\*.html pages"):
        await OfflineWebEngine(OfflineWebConfig(corpus_dir=str(tmp_path))).start()


async def test_web_tools_through_the_registry(engine: OfflineWebEngine, tmp_path: Path) -> None:
    registry = ToolRegistry([*builtin_tools(), *web_tools(engine)])
    assert "web" in registry.toolsets
    ctx = ToolContext(LocalWorkspace(tmp_path))
    found = json.loads(await registry.call("web_search", {"query": "Orvane moons", "max_results": 2}, ctx))
    assert len(found["results"]) <= 2 and found["results"][0]["url"].endswith("planet_orvane.html")
    read = json.loads(await registry.call("web_extract", json.dumps({"urls": found["results"][0]["url"]}), ctx))
    assert "Tessaly | 2011" in read["results"][0]["content"]
    assert "error" in json.loads(await registry.call("web_search", {"query": "  "}, ctx))
    assert (
        "max_results" in json.loads(await registry.call("web_search", {"query": "x", "max_results": 50}, ctx))["error"]
    )
    assert "at most 5" in json.loads(await registry.call("web_extract", {"urls": ["a"] * 6}, ctx))["error"]
    empty = json.loads(await registry.call("web_search", {"query": "zzzqqq"}, ctx))
    assert empty["results"] == [] and "no results" in empty["note"]


PAGES = [
    FakePage("https://en.example.org/wiki/Lighthouse", "Lighthouse", "A lighthouse is a tower that emits light."),
    FakePage("https://en.example.org/wiki/Bridge", "Bridge", "A bridge spans a river or valley."),
]


async def test_tavily_adapter_against_the_double() -> None:
    async with FakeTavilyServer(PAGES) as server:
        config = TavilyConfig(api_key=SecretStr(server.api_key), base_url=server.base_url)
        async with TavilyClient(config) as client:
            hits = await client.search("what is a lighthouse", 3)
            extracted = await client.extract(["https://en.example.org/wiki/Bridge", "https://gone.example/"])
        assert hits[0].url == "https://en.example.org/wiki/Lighthouse" and hits[0].snippet.startswith("A lighthouse")
        assert extracted.pages[0].content == "A bridge spans a river or valley."
        assert extracted.failed[0].url == "https://gone.example/"
        (path1, body1), (path2, body2) = server.requests
        assert path1 == "/search" and body1["query"] == "what is a lighthouse" and body1["max_results"] == 3
        assert body1["search_depth"] == "basic" and "api_key" not in body1  # key travels in the header only
        assert path2 == "/extract" and body2["urls"] == ["https://en.example.org/wiki/Bridge", "https://gone.example/"]


async def test_tavily_errors_are_explained() -> None:
    async with FakeTavilyServer(PAGES) as server:
        bad = TavilyConfig(api_key=SecretStr("tvly-wrong"), base_url=server.base_url)
        async with TavilyClient(bad) as client:
            with pytest.raises(WebBackendError, match="rejected the API key.*401"):
                await client.search("lighthouse", 1)
        good = TavilyConfig(api_key=SecretStr(server.api_key), base_url=server.base_url)
        async with TavilyClient(good) as client:
            server.fail_next = 429
            with pytest.raises(WebBackendError, match="rate limit"):
                await client.search("lighthouse", 1)
            # Through the tool, a backend failure is the model's information, not a crash.
            (search, _) = web_tools(client)
            server.fail_next = 432
            out = json.loads(await search.handler({"query": "lighthouse"}, ToolContext(LocalWorkspace(Path("/tmp")))))
            assert "plan limit" in out["error"]
    # Server gone: unreachable is reported, not raised past the tool.
    async with TavilyClient(TavilyConfig(api_key=SecretStr("k"), base_url=server.base_url)) as client:
        with pytest.raises(WebBackendError, match="unreachable"):
            await client.search("x", 1)


def test_backend_choice_follows_config() -> None:
    assert isinstance(make_web_backend(WebConfig(backend="offline")), OfflineWebEngine)
    keyed = WebConfig(tavily=TavilyConfig(api_key=SecretStr("tvly-x")))
    assert isinstance(make_web_backend(keyed), TavilyClient)
    assert isinstance(make_web_backend(keyed.model_copy(update={"backend": "offline"})), OfflineWebEngine)
    assert "tvly-x" not in repr(keyed) and "tvly-x" not in keyed.model_dump_json()
