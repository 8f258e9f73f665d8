"""One model server as the runtime knows it, and what can be learnt of it before a run: does it
answer, and which tokenizer goes with it. The runtime (environments/runtime.py) re-exports these."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from pydantic import BaseModel, Field

from environments.errors import HermesEnvError

__all__ = [
    "EMBEDDED",
    "EMBEDDED_MODEL_NAME",
    "ModelServer",
    "check_model_served",
    "check_server",
    "preflight_model",
    "resolve_tokenizer_name",
]

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
    """'embedded' -> the served model's own tokenizer, found on this machine (a directory or a hub repo
    in the local cache); with only the embedded server, the GGUF's, built locally. A served model whose
    tokenizer is not here is refused: tokens re-rendered with another model's tokenizer would be wrong."""
    if name != EMBEDDED:
        return name
    remote = [s for s in servers if s.base_url != EMBEDDED]
    if remote:
        candidate = remote[0].tokenizer or remote[0].model
        # Only a directory or an "org/name" can be a tokenizer; an API model name such as "gpt-4o" is not.
        loadable = Path(candidate).is_dir() or re.fullmatch(r"[\w.-]+/[\w.-]+", candidate)
        try:
            if not loadable:
                raise LookupError
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(candidate, local_files_only=True)  # offline: no minute of hub retries
            return candidate
        except Exception:  # not a tokenizer directory, or a repo not in the local cache
            raise HermesEnvError(
                f"no tokenizer for --openai.model_name {candidate!r} on this machine (a tokenizer directory or a "
                "hub repo in the local cache); pass --env.tokenizer_name with the served model's tokenizer"
            ) from None
    from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer

    embedded = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(embedded.model_path, chat_template=embedded.resolved_chat_template()))


def served_models(response: httpx.Response) -> list[str] | None:
    """The model ids of an OpenAI-style GET /models answer (None: not such an answer)."""
    try:
        ids = [str(entry["id"]) for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return None
    return ids or None


def check_model_served(base_url: str, model: str, response: httpx.Response) -> None:
    """A server that lists its models and not this one would answer every request with 404."""
    ids = served_models(response) if response.status_code == 200 else None
    if ids is not None and model not in ids:
        shown = ", ".join(repr(i) for i in ids[:5]) + (", ..." if len(ids) > 5 else "")
        raise HermesEnvError(
            f"--openai.model_name {model!r} is not served by {base_url} (it serves {shown}); pass one of those"
        )


async def preflight_model(base_url: str, model: str, api_key: str | None, timeout_s: float = 5.0) -> None:
    """Before anything starts: refuse a model the server says it does not serve. A server that does
    not answer is left to the runtime's check_server, which names it when the run starts."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.get(base_url.rstrip("/") + "/models", headers=headers)
    except httpx.HTTPError:
        return
    check_model_served(base_url, model, response)


async def check_server(base_url: str, timeout_s: float = 10.0, model: str | None = None) -> None:
    """Fail fast, naming the URL, when an OpenAI-compatible server does not answer (or does not serve `model`)."""
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
    if model is not None:
        check_model_served(base_url, model, response)
