"""What `serve` says about a posted group is what run-api answered: the real run-api for
`received` (a complete group) and `buffered` (a short one), a server answering 503 for the error
path (run-api itself answers 5xx only when it fails)."""

from __future__ import annotations

import httpx
from aiohttp import web

from environments.trainer_boundary import SendLedger, post_group
from tests.support.run_api import register_trainer, start_run_api, stop_process


def _group(n: int, env_id: int) -> dict:
    return {"tokens": [[1, 2, 3]] * n, "masks": [[-100, 2, 3]] * n, "scores": [1.0, 0.0, 0.5][:n], "env_id": env_id}


async def test_received_and_buffered_are_run_apis_own_answers(tmp_path):
    api, url = start_run_api(tmp_path)
    try:
        register_trainer(url, tmp_path / "ckpt", batch_size=2, num_steps=1)
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.get(url + "/batch")).json()["batch"] is None  # the trainer starts polling
            reg = await http.post(
                url + "/register-env",
                json={"max_token_length": 4096, "desired_name": "t", "weight": 1.0, "group_size": 2},
            )
            env_id = reg.json()["env_id"]
            ledger = SendLedger()
            short = await post_group(http, url + "/scored_data", _group(1, env_id))
            ledger.record(short, 1)
            whole = await post_group(http, url + "/scored_data", _group(2, env_id))
            ledger.record(whole, 2)
            batch = (await http.get(url + "/batch")).json()["batch"]
    finally:
        stop_process(api)
    assert short.status == "buffered" and short.line == "run-api buffered (1 sequences wait for a partner group)"
    assert whole.status == "received" and whole.line == "run-api received"
    assert [len(g["tokens"]) for g in batch] == [2]  # the trainer got the complete group, not the short one
    assert ledger.summary == "1 groups (2 sequences) received by run-api, 1 buffered, 0 not sent"


async def test_a_503_is_an_error_after_bounded_retries_never_sent():
    calls = 0

    async def overloaded(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(status=503, text="overloaded")

    app = web.Application()
    app.router.add_post("/scored_data", overloaded)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started just above
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await post_group(http, f"http://127.0.0.1:{port}/scored_data", _group(2, 0), backoff_s=0.01)
    finally:
        await runner.cleanup()
    assert calls == 3 and answer.status == "error"
    assert answer.line == "run-api error (after 3 attempts: HTTP 503: overloaded)"
    ledger = SendLedger()
    ledger.record(answer, 2)
    assert ledger.summary.startswith(
        "0 groups (0 sequences) received by run-api, 0 buffered, 1 not sent: 1 x run-api error"
    )
