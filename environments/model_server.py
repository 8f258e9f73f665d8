"""One model server as the runtime knows it, and what can be learnt of it before a run: does it
answer, and which tokenizer goes with it. The runtime (environments/runtime.py) re-exports these."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import httpx
from pydantic import BaseModel, Field

from environments.errors import HermesEnvError

__all__ = ["EMBEDDED", "EMBEDDED_MODEL_NAME", "ModelServer", "check_server", "resolve_tokenizer_name"]

logger = logging.getLogger("environments.runtime")  # the runtime's log, as before the move

# The bundled SmolLM2 model, as a base URL or a tokenizer name.
EMBEDDED = "embedded"
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelServer(BaseModel):
    """One model server; `embedded` starts the bundled llama.cpp server."""

    base_url: str = EMBEDDED
    model: str = EMBEDDED_MODEL_NAME
    api_key: str | None = Field(None, repr=False)
    timeout_s: float = Field(600.0, gt=0)
    server_type: str = Field("openai", description="atroposlib's server type: openai | vllm | sglang | trl")
    tokenizer: str | None = Field(None, description="The model's tokenizer, when its name differs from `model`")
    health_check: bool = Field(
        True, description="with several servers: probed every second; one that does not answer gets no new trajectory"
    )


def resolve_tokenizer_name(name: str, servers: list[ModelServer]) -> str:
    """'embedded' -> a served model's own tokenizer when it loads, else the GGUF's, built locally."""
    if name != EMBEDDED:
        return name
    remote = [s for s in servers if s.base_url != EMBEDDED]
    if remote:
        candidate = remote[0].tokenizer or remote[0].model
        # Only names that can be a hub repo ("org/name") or a local directory are worth a lookup;
        # an API model name such as "gpt-4o" would only stall on the hub's retries.
        looks_loadable = Path(candidate).is_dir() or re.fullmatch(r"[\w.-]+/[\w.-]+", candidate)
        try:
            if not looks_loadable:
                raise LookupError(f"{candidate!r} names no tokenizer repository")
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(candidate)
            return candidate
        except Exception as exc:  # offline, or a closed model such as gpt-4o
            logger.warning(
                "could not load tokenizer %r (%s); chat-mode tokens will use the embedded model's tokenizer. "
                "Pass --env.tokenizer_name to choose one.",
                candidate,
                type(exc).__name__,
            )
    from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer

    embedded = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(embedded.model_path, chat_template=embedded.resolved_chat_template()))


async def check_server(base_url: str, timeout_s: float = 10.0) -> None:
    """Fail fast, naming the URL, when an OpenAI-compatible server does not answer."""
    url = base_url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        raise HermesEnvError(
            f"cannot reach the model server at {base_url} ({type(exc).__name__}: {exc}); "
            "check --openai.base_url, or omit it to use the embedded model"
        ) from exc
    if response.status_code in (401, 403):
        raise HermesEnvError(
            f"the model server at {base_url} rejected the API key (HTTP {response.status_code}); check --openai.api_key"
        )
    if response.status_code >= 500 or response.status_code == 404:
        raise HermesEnvError(
            f"the model server at {base_url} answered GET /models with HTTP {response.status_code}; "
            "is this an OpenAI-compatible base URL (usually ending in /v1)?"
        )
