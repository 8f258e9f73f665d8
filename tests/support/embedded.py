"""Pointing an env's command line at the test session's embedded model server."""

from __future__ import annotations

from embedded_llm import EmbeddedLLM


def embedded_model_flags(llm: EmbeddedLLM) -> list[str]:
    """`--openai.*` and the tokenizer flags for the running `embedded_llm` fixture (no second server)."""
    return [
        "--openai.base_url",
        llm.base_url,
        "--openai.model_name",
        llm.model_name,
        "--openai.api_key",
        "local",
        "--env.tokenizer_name",
        str(llm.tokenizer_dir),
    ]
