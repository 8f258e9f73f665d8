"""Shared fixtures.

`embedded_llm`: ONE real llama.cpp server (SmolLM2-135M-Instruct via xllamacpp) for the whole test
session, started on first use and stopped at the end. It yields the running `EmbeddedLLM`:
`.base_url` (OpenAI, .../v1), `.server_url` (native endpoints), `.model_name`, `.tokenizer_dir`
(HF tokenizer for `AutoTokenizer.from_pretrained`, offline). Mark tests using it `@pytest.mark.llm`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig


@pytest.fixture(scope="session")
def embedded_llm() -> Iterator[EmbeddedLLM]:
    # Sync start/stop: a session fixture must not depend on a (function-scoped) event loop.
    llm = EmbeddedLLM(EmbeddedLLMConfig(n_parallel=4, ctx_size=4096, threads=2))
    llm.start()
    try:
        _ = llm.tokenizer_dir  # build (or reuse) the tokenizer once, before tests time anything
        yield llm
    finally:
        llm.stop()


@pytest.fixture(scope="session")
def project_sandbox_image() -> str:
    """The content-tagged sandbox image the Nomad/Modal doubles run (built once, reused by later sessions)."""
    import docker  # noqa: PLC0415 - only tests on the Docker engine need it

    from tests.support.sandbox_image import sandbox_image as build  # noqa: PLC0415

    client = docker.from_env()
    try:
        return build(client)
    finally:
        client.close()


def _expected_cost(item: pytest.Item) -> float:
    """A slow test's declared timeout, as a rough measure of its length; 1 for the other model tests, else 0."""
    if item.get_closest_marker("slow") is None:
        return 1.0 if item.get_closest_marker("llm") else 0.0
    timeout = item.get_closest_marker("timeout")
    return float(timeout.args[0]) if timeout and timeout.args else 600.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Longest files first (each file kept whole, in its own order, so module fixtures are set up as
    # before): with scripts/test.sh's one-at-a-time xdist scheduling, the long tests start early on
    # both workers and short ones fill the end, instead of a long test starting last on one worker.
    cost: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        cost[path] = max(cost.get(path, 0.0), _expected_cost(item))
    items.sort(key=lambda item: -cost[item.nodeid.split("::")[0]])  # stable: ties keep collection order
