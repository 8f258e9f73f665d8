"""How batch_runner's throughput scales with --concurrency (run by hand).

    .venv/bin/python -m bench.batch_runner_concurrency [--prompts 40] [--delay 0.2]

A local OpenAI-compatible server answers every chat request after `--delay` seconds
(a stand-in for model latency): each prompt makes one python tool call and then answers.
Prints prompts/s per concurrency and the ratio against concurrency 1 measured in the
same run; with latency-bound prompts the ratio should approach the concurrency.
"""

from __future__ import annotations

from bench.machine import load_note

import argparse
import asyncio
import io
import json
import tempfile
import time
import uuid
from pathlib import Path

from aiohttp import web

from batch_runner import BatchConfig, run_batch


async def chat(request: web.Request) -> web.Response:
    body = await request.json()
    await asyncio.sleep(request.app["delay"])
    if body["messages"][-1]["role"] == "user":
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"c{uuid.uuid4().hex[:6]}",
                    "type": "function",
                    "function": {"name": "python", "arguments": json.dumps({"code": "print(6*7)"})},
                }
            ],
        }
    else:
        message = {"role": "assistant", "content": "42"}
    return web.json_response(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "bench"}]})


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--delay", type=float, default=0.2)
    args = parser.parse_args()
    app = web.Application()
    app["delay"] = args.delay
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "p.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(args.prompts)))
        baseline = None
        for concurrency in (1, 4, 8):
            cfg = BatchConfig(
                dataset_file=dataset,
                run_name=f"c{concurrency}",
                model="bench",
                base_url=f"http://127.0.0.1:{port}/v1",
                output_dir=Path(tmp),
                distribution="math",
                concurrency=concurrency,
            )
            t0 = time.monotonic()
            await run_batch(cfg, stream=io.StringIO())
            rate = args.prompts / (time.monotonic() - t0)
            baseline = baseline or rate
            print(f"concurrency {concurrency}: {rate:6.2f} prompts/s  ratio vs concurrency 1: {rate / baseline:4.2f}x")
    await runner.cleanup()


if __name__ == "__main__":
    print(load_note(), flush=True)  # idle or loaded: how to read the ratios below
    asyncio.run(main())
