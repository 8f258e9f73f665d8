"""TinkerAtroposDouble: a test double of tinker-atropos, both of its faces.

Tinker is a cloud service; tinker-atropos (NousResearch) puts two things in front of it, and this
double follows their documented shapes (tinker_atropos/types.py and trainer.py):

- the inference service an env talks to: `GET /health` and SGLang-style `POST /generate` taking
  `input_ids` + `sampling_params` (`max_new_tokens`, `temperature`, `n`, `stop`) and answering
  `{"text", "meta_info": {"prompt_tokens", "completion_tokens", "finish_reason": "stop",
  "output_token_logprobs": [[logprob, token_id, token_text], ...]}}`: a *string* finish reason
  (always "stop"), no `output_ids`. Sampling is done by a real model (the embedded llama.cpp
  server's `/completion`) where Tinker's SamplingClient would sample.
- the trainer side: `tinker_datums(batch)` turns a run-api `/batch` into what tinker-atropos
  feeds `forward_backward(..., loss_fn="importance_sampling")`: per sequence, inputs
  `tokens[:-1]`, targets `tokens[1:]`, `inference_logprobs[i][1:]`, and the group-relative
  advantage on every position whose logprob is not the 1.0 "not sampled" marker (0 elsewhere);
  groups whose advantages are all zero are skipped. It raises where tinker-atropos would crash.

Run: `python -m tests.support.tinker_atropos_double --sampler http://127.0.0.1:PORT --port P`.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx
from aiohttp import web

__all__ = ["make_app", "tinker_datums"]


def make_app(sampler_url: str) -> web.Application:
    client = httpx.AsyncClient(timeout=1800)

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "trainer_initialized": True})

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("input_ids") is None:
            return web.json_response({"detail": "input_ids is required"}, status=400)
        params = body.get("sampling_params") or {}
        if params.get("n", 1) != 1:
            return web.json_response({"detail": "this double samples n=1 only"}, status=400)
        stop = params.get("stop") or []
        answer = await client.post(
            sampler_url.rstrip("/") + "/completion",
            json={
                "prompt": body["input_ids"],
                "n_predict": params.get("max_new_tokens", 256),
                "temperature": params.get("temperature", 1.0),
                "n_probs": 1,
                "return_tokens": True,
                "stream": False,
            },
        )
        answer.raise_for_status()
        payload = answer.json()
        tokens: list[int] = [int(t) for t in payload["tokens"]]
        if stop and any(t in stop for t in tokens):  # Tinker stops at a stop token and keeps it
            tokens = tokens[: next(i for i, t in enumerate(tokens) if t in stop) + 1]
        # llama.cpp gives no entry for a token ending inside a UTF-8 character; Tinker gives one for
        # every token. The double says so with a null logprob rather than inventing a number.
        entries = list(payload.get("completion_probabilities") or [])
        out: list[list[Any]] = []
        j = 0
        for tid in tokens:
            if j < len(entries) and int(entries[j]["id"]) == tid:
                out.append([entries[j].get("logprob"), tid, entries[j].get("token")])
                j += 1
            else:
                out.append([None, tid, None])
        return web.json_response(
            {
                "text": payload.get("content", ""),
                "meta_info": {
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(tokens),
                    "finish_reason": "stop",
                    "output_token_logprobs": out,
                },
            }
        )

    async def close(_app: web.Application) -> None:
        await client.aclose()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    app.on_cleanup.append(close)
    return app


def tinker_datums(batch: list[dict[str, Any]]) -> tuple[list[dict[str, list]], int]:
    """(datums, skipped groups) the way tinker-atropos's trainer builds them from a /batch."""
    datums: list[dict[str, list]] = []
    skipped = 0
    for group in batch:
        scores = [float(s) for s in group["scores"]]
        mean = sum(scores) / len(scores)
        advantages = [s - mean for s in scores]
        if len(scores) > 1 and all(a == 0.0 for a in advantages):
            skipped += 1
            continue
        for i, tokens in enumerate(group["tokens"]):
            logprobs = group["inference_logprobs"][i][1:]  # KeyError/TypeError without logprobs: its crash
            inputs, targets = tokens[:-1], tokens[1:]
            padded = [0.0 if lp == 1.0 else advantages[i] for lp in logprobs]
            if not (len(inputs) == len(targets) == len(logprobs) == len(padded)):
                raise AssertionError(f"length mismatch: {len(inputs)} inputs, {len(logprobs)} logprobs")
            if any(not isinstance(lp, float | int) for lp in logprobs):
                raise TypeError("a logprob is not a number: torch.tensor(..., dtype=float32) would fail")
            datums.append({"input": inputs, "target_tokens": targets, "logprobs": logprobs, "advantages": padded})
    return datums, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampler", required=True, help="llama.cpp server root (native /completion)")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(make_app(args.sampler), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    asyncio.set_event_loop(asyncio.new_event_loop())
    main()
