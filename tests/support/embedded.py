"""Pointing an env's command line at the test session's embedded model server."""

from __future__ import annotations

import functools
from pathlib import Path

from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig, ensure_gguf_tokenizer


@functools.cache
def embedded_tokenizer() -> str:
    """The bundled model's tokenizer directory, built from its GGUF offline: the tokenizer of tests
    whose model server is a double (an env refuses a served model whose tokenizer it cannot find)."""
    cfg = EmbeddedLLMConfig()
    return str(ensure_gguf_tokenizer(cfg.model_path, chat_template=cfg.resolved_chat_template()))


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


def small_group_flags(out: Path, *, max_turns: int = 2, max_tokens: int = 48) -> list[str]:
    """Groups of 2 short rollouts, saved to `out`: what the end-to-end command tests run."""
    return [
        "--env.group_size",
        "2",
        "--env.runtime.loop.max_turns",
        str(max_turns),
        "--env.runtime.loop.max_tokens",
        str(max_tokens),
        "--env.data_path_to_save_groups",
        str(out),
    ]
