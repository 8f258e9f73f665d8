"""Token-mode wiring for the runtime: which servers are token servers, and their models.

Chat mode (an OpenAI chat endpoint) cannot say which token ids the model sampled; the env
then re-renders finished conversations and sends no inference logprobs. Token mode talks to a
token server (`--env.runtime.token_server`, or `--openai.server_type vllm|sglang`) through
`TokenChatModel`, and each rollout's groups carry the exact ids, masks and logprobs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal, cast

from .chat_model import TokenChatConfig, TokenChatModel
from .servers import SAMPLER_KEYS, HTTPTokenServer, TokenServerConfig, TokenServerKind, check_sampler, make_token_server
from .session import NOT_SAMPLED, TokenTrace
from .template import ChatRenderer

__all__ = [
    "TokenServerChoice",
    "CHAT_MODE_NOTE",
    "LOGPROB_SEMANTICS",
    "resolve_token_server",
    "sampling_setup",
    "TokenModeModels",
    "trace_items",
    "finish_logprobs",
]

logger = logging.getLogger(__name__)

# atroposlib server types that speak a token protocol (for `auto`).
_AUTO_KIND: dict[str, TokenServerKind] = {"vllm": "vllm", "sglang": "sglang"}

TokenServerChoice = Literal["auto", "off", "vllm", "vllm_openai", "sglang", "llamacpp", "tinker"]

# What each protocol's logprobs describe (docs/trainers.md: "What inference_logprobs mean").
LOGPROB_SEMANTICS = {
    "raw_logits": "log-softmax of the raw logits: temperature 1, before top-k/top-p/min-p",
    "sampling_policy": "log-probability under the distribution sampled: after temperature and top-k/top-p/min-p",
    "server": "as the server reports them (see its docs); Tinker: its sampler's logprobs",
}

CHAT_MODE_NOTE = (
    "chat mode: {url} is used as an OpenAI chat endpoint, which cannot give the exact token ids the "
    "model sampled; tokens and masks are re-rendered from the messages and no inference_logprobs "
    "are sent. For exact tokens point at a token server with runtime.token_server "
    "vllm|vllm_openai|sglang|llamacpp (--env.runtime.token_server; batch_runner: --runtime.token_server)."
)


def resolve_token_server(
    choice: str, server_type: str, embedded: bool = False, tinker: bool = False
) -> TokenServerKind | None:
    """`auto`: atroposlib's `vllm`/`sglang` server types speak token protocols, and so does the
    embedded llama.cpp server; another `openai` endpoint does not. With tinker-atropos as the
    trainer (a `tinker:` YAML section) its `/generate` is the model server."""
    if choice == "off":
        return None
    if choice == "auto":
        if embedded:
            return "llamacpp"
        if tinker:
            return "tinker"
        return _AUTO_KIND.get(server_type)
    return cast(TokenServerKind, choice)  # every other choice is the name of a kind


def sampling_setup(
    kind: TokenServerKind | None,
    temperature: float,
    max_tokens: int | None,
    extra_body: dict[str, Any],
    inference_logprobs: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(extra request fields, the group's sampling record) for one token-server kind.

    llama.cpp truncates with top-k 40 / top-p 0.95 / min-p 0.05 unless told otherwise; those values
    are sent explicitly, so the record states the policy instead of trusting a server default
    (top_k 0 would sample the whole vocabulary, about 3x slower here). A user's `extra_body`
    (e.g. `{top_k: 0, top_p: 1.0, min_p: 0.0}` for plain temperature sampling) wins. The record
    says what was sent and what the logprobs describe; top_k/top_p/min_p not sent are recorded as
    None (unknown): the server fills them itself (vLLM and SGLang from the model's generation_config).
    A sampler setting the protocol cannot carry raises ValueError; `sampling_params` given in
    extra_body are sampler settings too (merged, never replacing the request's own).
    """
    extra_body = dict(extra_body)
    nested = extra_body.pop("sampling_params", None)
    if nested is not None:
        if not isinstance(nested, dict) or kind not in ("sglang", "tinker"):
            raise ValueError(
                f"--env.runtime.extra_body sampling_params is for the sglang and tinker protocols (got {kind}); "
                "give sampler settings at the top level of extra_body (top_k, top_p, min_p, seed)"
            )
        extra_body.update({"seed" if k == "sampling_seed" else k: v for k, v in nested.items()})
    request: dict[str, Any] = {}
    if kind == "llamacpp":
        request = {"top_k": 40, "top_p": 0.95, "min_p": 0.05}
        if inference_logprobs == "sampling_policy":
            request["post_sampling_probs"] = True
    elif inference_logprobs == "sampling_policy":
        raise ValueError(
            f"--env.inference_logprobs sampling_policy is a request option of llama.cpp only; with {kind} "
            "start the server so that it reports processed logprobs (vLLM: --logprobs-mode processed_logprobs) "
            "and keep raw_logits here"
        )
    request.update(extra_body)
    if kind is not None:
        check_sampler(kind, request)
    record: dict[str, Any] = {"token_server": kind, "temperature": temperature, "max_tokens": max_tokens}
    record.update({k: None for k in ("top_k", "top_p", "min_p")})  # unknown unless sent
    record.update({k: v for k, v in request.items() if k in SAMPLER_KEYS})
    unset = [k for k in ("top_k", "top_p", "min_p") if record[k] is None]
    if unset:
        record["server_defaults"] = (
            f"{', '.join(unset)} not sent: the server applied its own defaults (vLLM and SGLang take them from the "
            "model's generation_config), unknown here"
        )
    if kind is None:
        record["logprobs"] = None  # chat mode: none are sent
    elif kind == "llamacpp":
        record["logprobs"] = LOGPROB_SEMANTICS[
            "sampling_policy" if request.get("post_sampling_probs") else "raw_logits"
        ]
    elif kind in ("vllm", "vllm_openai"):
        record["logprobs"] = (
            "vLLM --logprobs-mode as launched (default raw_logprobs: " + LOGPROB_SEMANTICS["raw_logits"] + ")"
        )
    else:
        record["logprobs"] = LOGPROB_SEMANTICS["server"]
    return request, record


class TokenModeModels:
    """One token-server client per model server, one renderer; a fresh model per trajectory."""

    def __init__(
        self,
        servers: list[TokenServerConfig],
        tokenizer: Any,
        chat_template_path: str | None,
        chat_config: TokenChatConfig,
    ) -> None:
        template = Path(chat_template_path).read_text() if chat_template_path else None
        self.renderer = ChatRenderer(tokenizer, template)
        self.chat_config = chat_config
        self.clients: list[HTTPTokenServer] = [make_token_server(server) for server in servers]

    async def check(self) -> None:
        for client in self.clients:
            await client.check()

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    def make_model(self, index: int) -> TokenChatModel:
        return TokenChatModel(self.clients[index], self.renderer, self.chat_config)


def trace_items(trace: TokenTrace) -> list[tuple[list[int], list[int], list[float | None]]]:
    """(tokens, masks, logprobs) per sequence, for a ScoredDataGroup; a logprob is None where
    the position was not sampled or the server reported none (see `finish_logprobs`).

    A trace has more than one sequence only where the template was not append-only; each is
    a valid training item. Template tokens after a sequence's last sampled token (a turn that
    never ran because the context was full) carry no signal and would only push the item
    over the trainer's length, so they are cut; a sequence without sampled tokens is skipped.
    """
    if trace.restarts:
        logger.info("rollout split into %d token sequences: %s", len(trace.sequences), "; ".join(trace.restart_reasons))
    items = []
    for seq in trace.sequences:
        model_spans = [s for s in seq.spans if s.kind == "model" and s.end > s.start]
        if not model_spans:
            continue
        end = model_spans[-1].end
        items.append((seq.tokens[:end], seq.masks[:end], seq.logprobs[:end]))
    return items


def finish_logprobs(
    masks: list[int], logprobs: list[float | None], policy: str
) -> tuple[list[int], list[float], int] | None:
    """Apply `--env.missing_logprobs` to one sequence: (masks, inference_logprobs, gaps), or None
    to drop it. A gap is a trained position without a logprob (llama.cpp reports none for a
    token that ends inside a UTF-8 character). Untrained positions get atroposlib's 1.0 marker."""
    gaps = [i for i, (m, lp) in enumerate(zip(masks, logprobs)) if m != -100 and lp is None]
    if gaps and policy == "drop":
        return None
    if gaps and policy == "mask":
        masks = list(masks)
        for i in gaps:
            masks[i] = -100
    return masks, [NOT_SAMPLED if lp is None else lp for lp in logprobs], len(gaps)
