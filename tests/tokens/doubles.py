"""Test doubles for token servers that cannot run on these machines (SGLang, vLLM on GPU).

`ScriptedTokenServerDouble` is a real HTTP server on 127.0.0.1 that answers the documented
wire formats (vLLM native `/generate` as atroposlib's example server returns it, vLLM's
`/v1/completions` with `return_token_ids`, SGLang and tinker-atropos `/generate` with `return_logprob`,
llama.cpp's `/completion` with `return_tokens` and `n_probs`) from a
script of (token ids, logprobs, finish reason). It records every request body, so tests can
check what the client sent. A real vLLM run is the opt-in `vllm` tier.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Scripted:
    ids: list[int]
    logprobs: list[float]
    finish: str = "stop"


@dataclass
class ScriptedTokenServerDouble:
    script: list[Scripted]
    status: int = 200
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    url: str = ""

    async def __aenter__(self) -> "ScriptedTokenServerDouble":
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/completion", self._llamacpp)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._health)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started just above, so it has a server
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "data": [{"id": "m"}]})

    def _next(self) -> Scripted:
        return self.script.pop(0)

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/generate", body))
        if self.status != 200:
            return web.Response(status=self.status, text="engine dead")
        s = self._next()
        if "input_ids" in body:  # SGLang
            return web.json_response(
                {
                    "text": "",
                    "output_ids": s.ids,
                    "meta_info": {
                        "prompt_tokens": len(body["input_ids"]),
                        "completion_tokens": len(s.ids),
                        "finish_reason": {"type": s.finish, "matched": s.ids[-1]}
                        if s.finish == "stop"
                        else {"type": s.finish, "length": len(s.ids)},
                        "output_token_logprobs": [[lp, i, None] for i, lp in zip(s.ids, s.logprobs)],
                    },
                }
            )
        # vLLM native, as atroposlib's example server answers: one [{id: logprob, ...}] per position.
        # A decoy entry for another id checks that the client looks the sampled id up.
        positions = [[{str(i): lp, str(i + 1): lp - 5.0}] for i, lp in zip(s.ids, s.logprobs)]
        return web.json_response(
            {
                "text": [""],
                "prompt": "",
                "finish_reasons": [s.finish],
                "logprobs": [positions],
                "prompt_token_ids": body["prompt"]["prompt_token_ids"],
                "token_ids": [s.ids],
            }
        )

    async def _llamacpp(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/completion", body))
        if self.status != 200:
            return web.Response(status=self.status, text="engine dead")
        s = self._next()
        return web.json_response(
            {
                "content": "",
                "tokens": s.ids,
                "completion_probabilities": [{"id": i, "token": "", "logprob": lp} for i, lp in zip(s.ids, s.logprobs)],
                "stop_type": "eos" if s.finish == "stop" else "limit",
                "tokens_evaluated": len(body["prompt"]),
            }
        )

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("/v1/completions", body))
        if self.status != 200:
            return web.Response(status=self.status, text="engine dead")
        s = self._next()
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "token_ids": s.ids,
                        "prompt_token_ids": body["prompt"],
                        "logprobs": {
                            "tokens": [f"token_id:{i}" for i in s.ids],
                            "token_logprobs": s.logprobs,
                            "top_logprobs": None,
                            "text_offset": [],
                        },
                        "finish_reason": s.finish,
                    }
                ],
                "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(s.ids), "total_tokens": 0},
            }
        )
