"""The model's own chat template, rendered locally, and the tokenizer that goes with it.

Rendering goes through transformers' public `apply_chat_template(..., tokenize=False)` so
templates see the same helpers (`raise_exception`, `tojson`, `strftime_now`) they see in
vLLM and SGLang. Text is tokenized with `add_special_tokens=False`: templates write their
own BOS, and adding another would duplicate it. Control tokens spelled inside messages are
tokenized as text (`SpecialTokenShield`): only the template writes control ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.models.literal_specials import SpecialTokenShield

__all__ = ["ChatRenderer", "TurnClose", "TemplateError"]

# A string no template produces by itself: it marks where an assistant's content sits.
_MARK = "\u2063HERMES_RL_CONTENT\u2063"


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments as a mapping, as chat templates expect (OpenAI sends a JSON string;
    templates either `tojson` it, which would double-encode a string, or require a mapping)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                call = {**call, "function": {**fn, "arguments": parsed}}
        fixed.append(call)
    return {**message, "tool_calls": fixed}


class TemplateError(ValueError):
    """The chat template cannot be used for exact token tracking (explains why)."""


@dataclass(frozen=True)
class TurnClose:
    """How the template ends an assistant turn: the end-of-turn marker the model emits itself
    (e.g. `<|im_end|>`), as text and as ids."""

    text: str
    ids: tuple[int, ...]


class ChatRenderer:
    """Renders messages with one chat template and tokenizes the result."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        end_of_turn: str | None = None,
    ) -> None:
        template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
        if not template:
            raise TemplateError(
                "the tokenizer has no chat template; pass chat_template= (the model's .jinja text) "
                "or use a tokenizer directory whose tokenizer_config.json carries one"
            )
        self.tokenizer = tokenizer
        self.shield = SpecialTokenShield(tokenizer)
        self.template = template
        self.template_kwargs = dict(template_kwargs or {})
        self.close = self._probe_close(end_of_turn)

    @classmethod
    def from_files(
        cls, tokenizer_dir: str | Path, chat_template_path: str | Path | None = None, **kw: Any
    ) -> "ChatRenderer":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        template = Path(chat_template_path).read_text() if chat_template_path else None
        return cls(tokenizer, template, **kw)

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, add_generation_prompt: bool
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            [_template_message(m) for m in self.shield.messages(messages)],
            tools=tools or None,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )
        if not isinstance(text, str):  # transformers returns a list for batched input only
            raise TemplateError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def encode(self, text: str) -> list[int]:
        return self.shield.encode(text) if text else []

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _probe_close(self, end_of_turn: str | None) -> TurnClose:
        """Find the end-of-turn marker by rendering an assistant message whose content is a mark.

        The marker is the special token right after the content (`<|im_end|>`, `<|eot_id|>`,
        `<end_of_turn>`); without one, the text up to the first whitespace.
        """
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARK}]
        try:
            text = self.render(probe, None, add_generation_prompt=False)
        except Exception as exc:  # a template's own raise_exception, or a jinja error
            raise TemplateError(f"the chat template cannot render a user/assistant exchange: {exc}") from exc
        at = text.rfind(_MARK)
        if at < 0:
            raise TemplateError("the chat template drops assistant content; it cannot be used for training")
        after = text[at + len(_MARK) :]
        if end_of_turn is not None:
            if not after.lstrip(" ").startswith(end_of_turn):
                raise TemplateError(
                    f"the chat template does not close an assistant turn with end_of_turn={end_of_turn!r} (it writes {after[:40]!r})"
                )
            close = after[: after.index(end_of_turn) + len(end_of_turn)]
        else:
            specials = sorted((t for t in self.tokenizer.get_added_vocab() if t and after.startswith(t)), key=len)
            close = specials[-1] if specials else (after.split()[0] if after.split() else "")
        if not close:
            raise TemplateError(
                "the chat template writes no end-of-turn marker after an assistant message; "
                "exact multi-turn token tracking needs one (e.g. <|im_end|>)"
            )
        return TurnClose(text=close, ids=tuple(self.encode(close)))
