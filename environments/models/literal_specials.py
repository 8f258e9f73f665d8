"""Control-token text in messages is tokenized as text, never as control ids.

A tokenizer matches its special tokens (`<|im_end|>`, `<|im_start|>`, `<|eot_id|>`) anywhere in the
text it is given, so a rendered conversation whose tool result or user turn spells one would get a
real end-of-turn there, and a forged turn after it, in the ids the model sees and is trained on.
Before rendering, every special token spelled inside a message's strings is swapped for a mark no
one else can write (a per-instance nonce); encoding turns the template's own text into ids as usual
and each mark into the token's text split as ordinary text (`split_special_tokens=True`).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

__all__ = ["SpecialTokenShield"]

# Message keys whose strings are structure the template reads, not text it prints.
_STRUCTURE = frozenset({"role", "type", "id", "tool_call_id"})


class SpecialTokenShield:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
        for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
            if getattr(token, "special", False):
                specials.add(str(token.content))
        self.literals = sorted((s for s in specials if s), key=len, reverse=True)
        nonce = secrets.token_hex(8)  # ASCII letters and digits: survives any template's tojson unchanged
        self._index = {s: i for i, s in enumerate(self.literals)}
        self._mark = f"HRL{nonce}L{{}}Z"
        self._spelled = re.compile("|".join(map(re.escape, self.literals))) if self.literals else None
        self._marks = re.compile(f"HRL{nonce}L(\\d+)Z")

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`messages` with every special token spelled in their text replaced by its mark."""
        if self._spelled is None:
            return messages
        return [self._shield(m) for m in messages]

    def _shield(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, str):
            if key in _STRUCTURE or self._spelled is None:
                return value
            return self._spelled.sub(lambda m: self._mark.format(self._index[m.group()]), value)
        if isinstance(value, dict):
            return {k: self._shield(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self._shield(v, key) for v in value]
        return value

    def encode(self, text: str) -> list[int]:
        return self.encode_with_offsets(text, offsets=False)[0]

    def encode_with_offsets(self, text: str, *, offsets: bool = True) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of `text` (no BOS added); with `offsets`, each id's (start, end) in `text` (a mark's ids
        all span the mark)."""
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        at = 0
        for found in self._marks.finditer(text):
            self._plain(text[at : found.start()], at, ids, spans, offsets, split=False)
            literal = self.literals[int(found.group(1))]
            before = len(ids)
            self._plain(literal, 0, ids, spans, offsets, split=True)
            spans[before:] = [(found.start(), found.end())] * (len(ids) - before) if offsets else []
            at = found.end()
        self._plain(text[at:], at, ids, spans, offsets, split=False)
        return ids, spans

    def _plain(
        self, text: str, shift: int, ids: list[int], spans: list[tuple[int, int]], offsets: bool, *, split: bool
    ) -> None:
        if not text:
            return
        kwargs: dict[str, Any] = {"add_special_tokens": False}
        if split:
            kwargs["split_special_tokens"] = True
        if not offsets:
            ids.extend(self.tokenizer.encode(text, **kwargs))
            return
        enc = self.tokenizer(text, return_offsets_mapping=True, **kwargs)
        ids.extend(enc["input_ids"])
        spans.extend((a + shift, b + shift) for a, b in enc["offset_mapping"])
