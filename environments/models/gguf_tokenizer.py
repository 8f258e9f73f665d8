"""The embedded model's chat format and its offline HF tokenizer, both from the GGUF file.

`ensure_gguf_tokenizer(gguf)` writes tokenizer.json / tokenizer_config.json / special_tokens_map.json
built from the GGUF's own tokenizer metadata, so `AutoTokenizer.from_pretrained(dir)` works offline and
without torch. `HERMES_TOOLS_CHAT_TEMPLATE` is the chat template the embedded server renders with.
Used by embedded_llm.py (which re-exports both) and its `tokenizer` command.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["HERMES_TOOLS_CHAT_TEMPLATE", "EmbeddedLLMError", "ensure_gguf_tokenizer", "file_digest"]

_TOKENIZER_FORMAT_VERSION = "1"

# ChatML with Hermes-style tool calling. SmolLM2's own template ignores `tools=`, so tools would
# never reach the prompt; this one renders them in a <tools> block of the system turn and replays
# assistant tool calls as <tool_call> blocks and tool results as <tool_response> blocks (the format
# the `hermes` tool-call parser reads). Without tools it renders exactly what SmolLM2's template
# renders, default system prompt included.
HERMES_TOOLS_CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_message = messages[0].content -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_message = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system_message -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>\' -}}'
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in loop_messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message.content if message.content is string else '') -}}"
    "{%- if message.tool_calls -%}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- set fn = tool_call.function if tool_call.function is defined else tool_call -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' -}}'
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>tool\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


class EmbeddedLLMError(RuntimeError):
    """The embedded server could not be started, or its model/tokenizer could not be read."""


# tokenizer.ggml.pre -> pre-tokenizer. "smollm" (like starcoder) splits every digit on its own,
# then applies the GPT-2 byte-level regex (llama.cpp: LLAMA_VOCAB_PRE_TYPE_SMOLLM).
_PRE_TOKENIZERS = {
    "smollm": "digits+bytelevel",
    "starcoder": "digits+bytelevel",
    "refact": "digits+bytelevel",
    "gpt-2": "bytelevel",
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def file_digest(path: Path) -> str:
    """The file's sha256, the key of what is built from it: a fresh checkout or venv (the same model
    file at a new path, with a new mtime) reuses what an earlier one built. Memoised per file state."""
    st = path.stat()
    return _file_digest(str(path), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=16)
def _file_digest(path: str, size: int, mtime_ns: int, ino: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # ~0.1 s for the 98 MB embedded model


def _default_tokenizer_cache() -> Path:
    return Path.home() / ".cache" / "hermes-rl" / "tokenizers"


def ensure_gguf_tokenizer(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    chat_template: str | None = None,
) -> Path:
    """Write a HF tokenizer directory (tokenizer.json, tokenizer_config.json, special_tokens_map.json)
    built from a GGUF file's own tokenizer metadata, and return it.

    `AutoTokenizer.from_pretrained(dir)` then works offline and without torch. `chat_template`
    overrides the GGUF's template (pass the one the server uses). Without `out_dir` the result is
    cached under `cache_dir` (default ~/.cache/hermes-rl/tokenizers/<hash>); the write is atomic and
    an existing complete directory is reused.
    """
    gguf_path = Path(gguf_path).resolve()
    if not gguf_path.is_file():
        raise EmbeddedLLMError(f"GGUF file not found: {gguf_path}")
    if out_dir is None:
        key = json.dumps([_TOKENIZER_FORMAT_VERSION, file_digest(gguf_path), chat_template]).encode()
        base = Path(cache_dir) if cache_dir is not None else _default_tokenizer_cache()
        target = base / hashlib.sha256(key).hexdigest()[:16]
    else:
        target = Path(out_dir)
    if (target / "tokenizer_config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    files = _tokenizer_files(gguf_path, chat_template)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if target.exists():
            # An out_dir given by the caller may exist (e.g. empty): fill it file by file, each atomically.
            for name in files:
                os.replace(tmp / name, target / name)
        else:
            try:
                os.rename(tmp, target)
            except OSError:
                if not (target / "tokenizer_config.json").is_file():  # someone else won the race?
                    raise
    finally:
        if tmp.exists():
            for p in tmp.iterdir():
                p.unlink()
            tmp.rmdir()
    return target


def _gguf_fields(gguf_path: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(gguf_path))
    except Exception as exc:  # the reader raises bare ValueErrors/struct errors on bad files
        raise EmbeddedLLMError(f"cannot read GGUF metadata from {gguf_path}: {exc}") from exc
    return {
        name: field.contents()
        for name, field in reader.fields.items()
        if name.startswith("tokenizer.") or name.endswith(".context_length")
    }


def _tokenizer_files(gguf_path: Path, chat_template: str | None) -> dict[str, str]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    f = _gguf_fields(gguf_path)
    kind = f.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise EmbeddedLLMError(
            f"{gguf_path.name}: tokenizer model {kind!r} is not supported; only byte-level BPE ('gpt2') is"
        )
    pre = f.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise EmbeddedLLMError(
            f"{gguf_path.name}: pre-tokenizer {pre!r} is not supported; known: {sorted(_PRE_TOKENIZERS)}"
        )
    tokens: list[str] = list(f["tokenizer.ggml.tokens"])
    types: list[int] = list(f.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in f["tokenizer.ggml.merges"]]

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(
        add_prefix_space=bool(f.get("tokenizer.ggml.add_space_prefix")), use_regex=True
    )
    if _PRE_TOKENIZERS[pre] == "digits+bytelevel":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    # Control tokens are special (skipped when decoding with skip_special_tokens); user-defined
    # ones are matched whole in text but decoded like ordinary text.
    tok.add_tokens(
        [
            AddedToken(tokens[i], special=(types[i] == _CONTROL), normalized=False)
            for i in range(len(tokens))
            if types[i] in (_CONTROL, _USER_DEFINED)
        ]
    )

    def token_of(key: str) -> str | None:
        idx = f.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(idx)] if idx is not None and 0 <= int(idx) < len(tokens) else None

    bos, eos, unk, pad = token_of("bos"), token_of("eos"), token_of("unknown"), token_of("padding")
    add_bos = bool(f.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(f.get("tokenizer.ggml.add_eos_token", False))
    if (add_bos and bos) or (add_eos and eos):
        single = ([f"{bos}:0"] if add_bos and bos else []) + ["$A:0"] + ([f"{eos}:0"] if add_eos and eos else [])
        pair = single + [p.replace("$A", "$B").replace(":0", ":1") for p in single]
        specials = [(t, tokens.index(t)) for t in {bos if add_bos else None, eos if add_eos else None} if t]
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    special_map = {
        k: v for k, v in (("bos_token", bos), ("eos_token", eos), ("unk_token", unk), ("pad_token", pad)) if v
    }
    template = chat_template if chat_template is not None else f.get("tokenizer.chat_template")
    ctx_len = next((int(v) for k, v in f.items() if k.endswith(".context_length")), None)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ctx_len or 1_000_000,
        "added_tokens_decoder": {
            str(i): {
                "content": tokens[i],
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": types[i] == _CONTROL,
            }
            for i in range(len(tokens))
            if types[i] in (_CONTROL, _USER_DEFINED)
        },
    }
    if template:
        config["chat_template"] = template
    return {
        "tokenizer.json": tok.to_str(pretty=False),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special_map, indent=2, ensure_ascii=False),
    }
