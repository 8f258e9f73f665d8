"""Token-level inference servers: prompt token ids in, generated ids and logprobs out.

Four wire protocols, one `TokenServer` interface:

- `vllm`: atroposlib's `/generate` (vLLM native; `{"prompt": {"prompt_token_ids": [...]}, "logprobs": 0}`)
- `vllm_openai`: vLLM's own `/v1/completions` with a token-id prompt, `logprobs` and `return_token_ids`
- `sglang`: SGLang `/generate` with `input_ids` and `return_logprob`
- `llamacpp`: llama.cpp's native `/completion` with a token-id prompt, `n_probs` and `return_tokens`
- `tinker`: tinker-atropos's SGLang-style `/generate` in front of Tinker's sampler: `input_ids` and
  `sampling_params` with `stop` as token ids; the answer has `meta_info.output_token_logprobs` as
  `(logprob, id, text)`, a string `finish_reason` (always "stop") and no `output_ids`

Sampler settings (`top_k`, `top_p`, `min_p`, `seed`, penalties) go where each protocol reads them
(`SAMPLER_FIELDS`): the top level of the request for vLLM and llama.cpp, inside `sampling_params`
for SGLang (merged with temperature, max_new_tokens and stop ids, never replacing them). A setting
a protocol cannot carry (tinker-atropos reads only max_new_tokens, temperature, n and stop) is
refused by `check_sampler` before any request.

Logprobs come back aligned one to one with the generated ids; where a server reports none
for a token (llama.cpp omits entries for tokens that end inside a UTF-8 character) the entry
is None, never shifted. Server failures raise `ModelError` (infrastructure, not the model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx
from pydantic import BaseModel, Field

from environments.models.base import ModelError, ModelRequestError, is_request_error

__all__ = [
    "Generation",
    "TokenServer",
    "TokenServerConfig",
    "TokenServerKind",
    "HTTPTokenServer",
    "make_token_server",
    "align_llamacpp_logprobs",
    "SAMPLER_FIELDS",
    "SAMPLER_KEYS",
    "check_sampler",
    "place_extra",
]

TokenServerKind = Literal["vllm", "vllm_openai", "sglang", "llamacpp", "tinker"]


_PENALTIES = frozenset({"presence_penalty", "frequency_penalty"})
# Per protocol: where sampler settings go ("top" level or "sampling_params") and which it reads,
# as {our name: the protocol's name}. From each server's request schema: vLLM SamplingParams and
# its OpenAI completions request, SGLang's sampling_params (seed is `sampling_seed`), llama.cpp's
# /completion (`repeat_penalty`), tinker-atropos's /generate (max_new_tokens, temperature, n, stop).
SAMPLER_FIELDS: dict[str, tuple[Literal["top", "sampling_params"], dict[str, str]]] = {
    "vllm": ("top", {k: k for k in {"top_k", "top_p", "min_p", "seed", "repetition_penalty", *_PENALTIES}}),
    "vllm_openai": ("top", {k: k for k in {"top_k", "top_p", "min_p", "seed", "repetition_penalty", *_PENALTIES}}),
    "sglang": (
        "sampling_params",
        {**{k: k for k in {"top_k", "top_p", "min_p", "repetition_penalty", *_PENALTIES}}, "seed": "sampling_seed"},
    ),
    "llamacpp": ("top", {k: k for k in {"top_k", "top_p", "min_p", "seed", "repeat_penalty", *_PENALTIES}}),
    "tinker": ("sampling_params", {}),
}
SAMPLER_KEYS = frozenset(k for _, fields in SAMPLER_FIELDS.values() for k in fields) | {"sampling_seed"}


def check_sampler(kind: str, extra: dict[str, Any]) -> None:
    """Raise ValueError, in one line, for a sampler setting the protocol would silently ignore."""
    _, fields = SAMPLER_FIELDS[kind]
    unknown = sorted(k for k in extra if k in SAMPLER_KEYS and k not in fields)
    if unknown:
        readable = ", ".join(["temperature", "max_tokens", *sorted(fields)])
        raise ValueError(
            f"--env.runtime.extra_body {', '.join(unknown)}: the {kind} token protocol cannot carry it (it reads {readable}); "
            "remove it or use a server whose protocol does"
        )


def place_extra(kind: str, body: dict[str, Any], extra: dict[str, Any]) -> None:
    """Put `extra` into a request body where `kind` reads it: sampler settings per SAMPLER_FIELDS,
    anything else (a llama.cpp `grammar`, `post_sampling_probs`) at the top level."""
    where, fields = SAMPLER_FIELDS[kind]
    for key, value in extra.items():
        if key in fields and where == "sampling_params":
            body["sampling_params"][fields[key]] = value
        else:
            body[key] = value


class TokenServerConfig(BaseModel):
    kind: TokenServerKind
    base_url: str = Field(description="Server URL; a trailing /v1 is handled per protocol")
    model: str = Field("default", description="Model name (sent by the vllm_openai protocol)")
    api_key: str | None = Field(None, description="Bearer token, if the server wants one")
    timeout_s: float = Field(600.0, gt=0)
    max_connections: int = Field(64, ge=1)
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra request fields: sampler settings where the protocol reads them, others at the top level",
    )


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float | None]  # one per token; None where the server reported none
    finish_reason: str  # "stop" | "length" | what the server said
    prompt_tokens: int | None = None


class TokenServer(Protocol):
    config: TokenServerConfig

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        stop_token_ids: list[int] | None = None,
        seed: int | None = None,
        grammar: str | None = None,
    ) -> Generation:
        """`grammar`: a llama.cpp grammar the sampling must follow (the llamacpp protocol only)."""
        ...

    async def check(self) -> None:
        """Raise ModelError, naming the URL, when the server does not answer."""
        ...

    async def aclose(self) -> None: ...


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class HTTPTokenServer:
    """One client per server (one connection pool), shared by its trajectories."""

    def __init__(self, config: TokenServerConfig, client: httpx.AsyncClient | None = None) -> None:
        check_sampler(config.kind, config.extra_body)
        self.config = config
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        limits = httpx.Limits(max_connections=config.max_connections)
        self._client = client or httpx.AsyncClient(timeout=config.timeout_s, headers=headers, limits=limits)
        self._root = _root(config.base_url)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def check(self) -> None:
        path = "/v1/models" if self.config.kind == "vllm_openai" else "/health"
        try:
            response = await self._client.get(self._root + path, timeout=10.0)
        except httpx.HTTPError as exc:
            raise ModelError(
                f"cannot reach the {self.config.kind} token server at {self._root} ({type(exc).__name__}: {exc}); "
                "check --openai.base_url and that the server is running"
            ) from exc
        if response.status_code >= 400:
            raise ModelError(
                f"the {self.config.kind} token server at {self._root} answered GET {path} with HTTP "
                f"{response.status_code}; is --env.runtime.token_server the right protocol for this server?"
            )

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        stop_token_ids: list[int] | None = None,
        seed: int | None = None,
        grammar: str | None = None,
    ) -> Generation:
        path, body = _REQUESTS[self.config.kind](
            self.config, list(prompt_ids), max_tokens, temperature, stop_token_ids, seed
        )
        place_extra(self.config.kind, body, self.config.extra_body)
        if grammar is not None:
            if self.config.kind != "llamacpp":  # checked when the runtime starts; a direct caller gets this
                raise ModelRequestError(f"a sampling grammar needs the llamacpp token protocol, not {self.config.kind}")
            body["grammar"] = grammar
        url = self._root + path
        try:
            response = await self._client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise ModelError(f"token server request to {url} failed: {type(exc).__name__}: {exc}") from exc
        if is_request_error(response.status_code):
            raise ModelRequestError(
                f"token server at {url} refused the request (HTTP {response.status_code}): {response.text[:300]}"
            )
        if response.status_code >= 400:
            raise ModelError(
                f"token server at {url} answered HTTP {response.status_code}: {response.text[:300]}",
                retryable=response.status_code >= 500 or response.status_code == 429,
            )
        try:
            payload = response.json()
            generation = _RESPONSES[self.config.kind](payload)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ModelError(
                f"token server at {url} sent an answer the {self.config.kind} protocol does not describe "
                f"({type(exc).__name__}: {exc}); is --env.runtime.token_server right for this server?",
                retryable=False,
            ) from exc
        if len(generation.logprobs) != len(generation.token_ids):
            raise ModelError(
                f"token server at {url}: {len(generation.logprobs)} logprobs for {len(generation.token_ids)} tokens",
                retryable=False,
            )
        return generation


def make_token_server(config: TokenServerConfig, client: httpx.AsyncClient | None = None) -> HTTPTokenServer:
    return HTTPTokenServer(config, client)


# -- request builders: (config, prompt ids, max_tokens, temperature, stop ids, seed) -> (path, body)


def _vllm_request(cfg, ids, max_tokens, temperature, stop_ids, seed):
    body: dict[str, Any] = {
        "prompt": {"prompt_token_ids": ids},
        "logprobs": 0,  # only the sampled token's logprob
        "max_tokens": max_tokens,
        "temperature": temperature,
        "n": 1,
    }
    if stop_ids:
        body["stop_token_ids"] = stop_ids
    if seed is not None:
        body["seed"] = seed
    return "/generate", body


def _vllm_openai_request(cfg, ids, max_tokens, temperature, stop_ids, seed):
    body: dict[str, Any] = {
        "model": cfg.model,
        "prompt": ids,  # a list of ints is a token-id prompt
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if stop_ids:
        body["stop_token_ids"] = stop_ids
    if seed is not None:
        body["seed"] = seed
    return "/v1/completions", body


def _sglang_request(cfg, ids, max_tokens, temperature, stop_ids, seed):
    params: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": temperature, "skip_special_tokens": False}
    if stop_ids:
        params["stop_token_ids"] = stop_ids
    if seed is not None:
        params["sampling_seed"] = seed
    return "/generate", {
        "input_ids": ids,
        "sampling_params": params,
        "return_logprob": True,
        "return_text_in_logprobs": False,
    }


def _tinker_request(cfg, ids, max_tokens, temperature, stop_ids, seed):
    # tinker-atropos reads max_new_tokens, temperature, n and stop; Tinker stops on token ids too.
    params: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": temperature, "n": 1}
    if stop_ids:
        params["stop"] = list(stop_ids)
    return "/generate", {"input_ids": ids, "sampling_params": params, "return_logprob": True}


def _llamacpp_request(cfg, ids, max_tokens, temperature, stop_ids, seed):
    body: dict[str, Any] = {
        "prompt": ids,
        "n_predict": max_tokens,
        "temperature": temperature,
        "n_probs": 1,
        "return_tokens": True,
        "cache_prompt": True,  # the held prefix is reused turn after turn
        "stream": False,
    }
    if seed is not None:
        body["seed"] = seed
    return "/completion", body


# -- response parsers: payload -> Generation


def _vllm_response(p: dict[str, Any]) -> Generation:
    positions = p["logprobs"][0]  # [[{id: logprob, ...}], ...] for the first (only) completion
    token_ids = (
        [int(t) for t in p["token_ids"][0]] if p.get("token_ids") else [int(next(iter(pos[0]))) for pos in positions]
    )
    logprobs: list[float | None] = []
    for tid, pos in zip(token_ids, positions):
        entry = pos[0] if isinstance(pos, list) else pos
        lp = entry.get(str(tid), entry.get(tid))  # JSON keys are strings
        logprobs.append(float(lp) if lp is not None else None)
    logprobs += [None] * (len(token_ids) - len(logprobs))
    return Generation(
        token_ids, logprobs, _finish(p["finish_reasons"][0]), len(p.get("prompt_token_ids") or []) or None
    )


def _vllm_openai_response(p: dict[str, Any]) -> Generation:
    choice = p["choices"][0]
    if choice.get("token_ids") is None:
        raise KeyError("choices[0].token_ids (the server ignored return_token_ids; vLLM >= 0.10.2 supports it)")
    token_ids = [int(t) for t in choice["token_ids"]]
    lp = (choice.get("logprobs") or {}).get("token_logprobs") or []
    logprobs = [float(x) if x is not None else None for x in lp[: len(token_ids)]]
    logprobs += [None] * (len(token_ids) - len(logprobs))
    usage = p.get("usage") or {}
    return Generation(token_ids, logprobs, _finish(choice.get("finish_reason")), usage.get("prompt_tokens"))


def _sglang_response(p: Any) -> Generation:
    if isinstance(p, list):
        p = p[0]
    meta = p["meta_info"]
    entries = meta.get("output_token_logprobs") or []  # [[logprob, token_id, text|None], ...]
    token_ids = [int(t) for t in p["output_ids"]] if p.get("output_ids") is not None else [int(e[1]) for e in entries]
    by_position = [(int(e[1]), e[0]) for e in entries]
    logprobs: list[float | None] = []
    for i, tid in enumerate(token_ids):
        if i < len(by_position) and by_position[i][0] == tid and by_position[i][1] is not None:
            logprobs.append(float(by_position[i][1]))
        else:
            logprobs.append(None)
    return Generation(token_ids, logprobs, _finish(meta.get("finish_reason")), meta.get("prompt_tokens"))


def align_llamacpp_logprobs(token_ids: list[int], probabilities: list[dict[str, Any]]) -> list[float | None]:
    """llama.cpp reports no probability entry for a token that ends inside a UTF-8 character;
    the entry of the token completing it carries that token's id. Walk both in order, by id."""
    out: list[float | None] = []
    j = 0
    for tid in token_ids:
        if j < len(probabilities) and int(probabilities[j]["id"]) == tid:
            entry = probabilities[j]
            lp = entry.get("logprob")
            if lp is None and entry.get("prob") is not None:  # older servers report probabilities
                lp = math.log(entry["prob"]) if entry["prob"] > 0 else float("-inf")
            out.append(float(lp) if lp is not None else None)
            j += 1
        else:
            out.append(None)
    if j != len(probabilities):
        raise ValueError(f"{len(probabilities) - j} llama.cpp probability entries match no generated token")
    return out


def _llamacpp_response(p: dict[str, Any]) -> Generation:
    if "tokens" not in p:
        raise KeyError("tokens (the server ignored return_tokens; update llama.cpp)")
    token_ids = [int(t) for t in p["tokens"]]
    logprobs = align_llamacpp_logprobs(token_ids, p.get("completion_probabilities") or [])
    stop_type = p.get("stop_type")
    finish = "length" if stop_type == "limit" else "stop" if stop_type in ("eos", "word") else str(stop_type)
    return Generation(token_ids, logprobs, finish, p.get("tokens_evaluated"))


def _finish(reason: Any) -> str:
    if isinstance(reason, dict):  # SGLang: {"type": "stop", "matched": 2}
        reason = reason.get("type")
    return str(reason or "stop")


_REQUESTS = {
    "vllm": _vllm_request,
    "vllm_openai": _vllm_openai_request,
    "sglang": _sglang_request,
    "llamacpp": _llamacpp_request,
    "tinker": _tinker_request,
}
_RESPONSES = {
    "vllm": _vllm_response,
    "vllm_openai": _vllm_openai_response,
    "sglang": _sglang_response,
    "llamacpp": _llamacpp_response,
    "tinker": _sglang_response,  # the same shape, without output_ids
}
