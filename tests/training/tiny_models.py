"""Tiny random Llama checkpoints made in the test (never from a hub), with the embedded tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch


def tiny_llama(out: Path, seed: int, dtype: torch.dtype = torch.float32, tokenizer_dir: Path | None = None) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from training.models import copy_tokenizer

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # norms start at exactly 1 in every seed: make every tensor differ
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model = model.to(dtype)
    model.save_pretrained(str(out))
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, out)
    return out


def embedded_tokenizer_dir() -> Path:
    from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer

    embedded = EmbeddedLLMConfig()
    return Path(ensure_gguf_tokenizer(embedded.model_path, chat_template=embedded.resolved_chat_template()))
