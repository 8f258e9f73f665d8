from __future__ import annotations

import aiohttp
import pytest

from backends.process import start_sandbox_process
from slots.client import SandboxAddress, SandboxClient


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def server(tmp_path):
    proc = await start_sandbox_process(data_dir=tmp_path / "sandbox", slots=3)
    try:
        yield proc
    finally:
        await proc.stop()


@pytest.fixture
async def client(server, http):
    return SandboxClient(SandboxAddress(f"pid-{server.pid}", server.url, server.token), http)
