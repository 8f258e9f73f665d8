"""Exact token ids for one multi-turn conversation, append-only.

The session holds the ids the model saw and produced. The first prompt is rendered with the
chat template and tokenized once. After the model answers, its generated ids are appended
as they came back from the server (never re-tokenized). For the next turn only the newly
rendered suffix is tokenized and appended: what the template writes after the assistant's
end-of-turn marker, the new messages (tool results, a user reply) and the generation
prompt. That suffix is the difference between two renders of a *stand-in* conversation (the
system message, the last user message, the previous assistant turn with its results and
the new assistant turn) without and with the new messages, so a turn costs the same at
turn 50 as at turn 1.

A template is append-only when the render with the new messages starts with the render
without them. Some are not (Qwen3 drops earlier reasoning once a new user message arrives):
then the held ids no longer match what the template would show the model, so the session
closes the sequence and starts a new one from a full render, counted in `restarts` with the
reason. Each sequence's invariant (held ids == prompt + generated + suffix pieces, in order)
is checked as pieces are appended and in full by `TokenSequence.verify()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .template import ChatRenderer

__all__ = ["Span", "TokenSequence", "TokenTrace", "TokenSession", "NOT_SAMPLED"]

SpanKind = Literal["prompt", "model", "template"]

# atroposlib's marker for "no sampling logprob at this position" (a probability > 1).
NOT_SAMPLED = 1.0


@dataclass(frozen=True)
class Span:
    kind: SpanKind  # prompt: first render; model: generated ids; template: a turn's suffix
    start: int
    end: int


@dataclass
class TokenSequence:
    """One contiguous token sequence: ids, which were sampled, and their logprobs."""

    tokens: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    # One entry per token: None at positions that were not sampled (prompt, tool results)
    # and at sampled positions whose logprob the server did not report (an explicit gap).
    logprobs: list[float | None] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    pieces: list[list[int]] = field(default_factory=list)

    def append(self, kind: SpanKind, ids: list[int], logprobs: list[float | None] | None = None) -> None:
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(ids)} tokens: they must align one to one")
        start = len(self.tokens)
        piece = list(ids)
        self.tokens.extend(piece)
        self.trained.extend([kind == "model"] * len(piece))
        self.logprobs.extend(logprobs if logprobs is not None else [None] * len(piece))
        self.spans.append(Span(kind, start, start + len(piece)))
        self.pieces.append(piece)
        # The per-turn invariant, in O(new tokens): pieces tile the sequence in order.
        prev_end = self.spans[-2].end if len(self.spans) > 1 else 0
        # (Raised, not `assert`ed: the check must also run under `python -O`.)
        if not (
            start == prev_end and len(self.tokens) == self.spans[-1].end == len(self.trained) == len(self.logprobs)
        ):
            raise AssertionError("token sequence lost alignment: pieces no longer tile the held ids")
        if self.tokens[start:] != piece:
            raise AssertionError("appended ids differ from the piece that was appended")

    def verify(self) -> None:
        """Full check: the held ids are exactly the concatenation of the appended pieces."""
        joined = [t for p in self.pieces for t in p]
        if joined != self.tokens or len(self.trained) != len(self.tokens) or len(self.logprobs) != len(self.tokens):
            raise AssertionError("held token ids differ from prompt + generated + suffix pieces")

    @property
    def masks(self) -> list[int]:
        """atroposlib's convention: the token id where trained, -100 elsewhere."""
        return [t if m else -100 for t, m in zip(self.tokens, self.trained)]

    @property
    def inference_logprobs(self) -> list[float]:
        """Logprobs for a ScoredDataGroup: `NOT_SAMPLED` (1.0) where there is none."""
        return [NOT_SAMPLED if lp is None else lp for lp in self.logprobs]

    @property
    def logprob_gaps(self) -> int:
        return sum(1 for m, lp in zip(self.trained, self.logprobs) if m and lp is None)


@dataclass
class TokenTrace:
    """Everything a trainer needs from one conversation (usually a single sequence)."""

    sequences: list[TokenSequence]
    restarts: int
    restart_reasons: list[str]
    full_renders: int  # turns whose suffix needed a full render because the stand-in failed

    @property
    def logprob_gaps(self) -> int:
        return sum(s.logprob_gaps for s in self.sequences)


class TokenSession:
    """The token-level view of one conversation; feed it the same messages the agent sees."""

    def __init__(self, renderer: ChatRenderer, tools: list[dict[str, Any]] | None = None) -> None:
        self.renderer = renderer
        self.tools = tools or None
        self.messages: list[dict[str, Any]] = []
        self.sequences: list[TokenSequence] = []
        self.restarts = 0
        self.restart_reasons: list[str] = []
        self.full_renders = 0
        self._last_user = -1  # index of the last user message
        self._prev_assistant = -1  # index of the assistant turn before the newest one
        self._newest_assistant = -1
        self._awaiting_generation = False

    # -- the conversation ---------------------------------------------------------------

    @property
    def current(self) -> TokenSequence:
        if not self.sequences:
            raise RuntimeError("TokenSession.start() must be called first")
        return self.sequences[-1]

    @property
    def prompt_ids(self) -> list[int]:
        return self.current.tokens

    def start(self, messages: list[dict[str, Any]]) -> list[int]:
        """Render and tokenize the first prompt; returns the ids to send."""
        if self.sequences:
            raise RuntimeError("TokenSession.start() called twice; use a new session per conversation")
        for m in messages:
            self._track(m)
        self._new_sequence()
        return self.current.tokens

    def add_generation(self, ids: list[int], logprobs: list[float | None], message: dict[str, Any]) -> None:
        """Append what the model produced and the assistant message parsed from it."""
        if not self._awaiting_generation:
            raise RuntimeError("add_generation() without a prompt: call start() or extend() first")
        self.current.append("model", ids, logprobs)
        self._track(message)
        self._awaiting_generation = False

    def extend(self, new_messages: list[dict[str, Any]]) -> list[int]:
        """Append the suffix for messages that follow the last assistant turn; returns the ids to send."""
        if self._awaiting_generation:
            raise RuntimeError("extend() before the model answered the previous prompt")
        if not new_messages:
            raise ValueError("extend() needs at least one new message (tool results or a user reply)")
        a_idx = len(self.messages) - 1
        if self.messages[a_idx].get("role") != "assistant":
            raise RuntimeError("extend() must follow an assistant turn")
        gen = self.current.pieces[-1] if self.current.spans[-1].kind == "model" else []
        prev_assistant, last_user = self._prev_assistant, self._last_user
        for m in new_messages:
            self._track(m)
        suffix, why = self._suffix(a_idx, new_messages, gen, prev_assistant, last_user)
        if suffix is None:
            self.restarts += 1
            self.restart_reasons.append(why)
            self._new_sequence()
        else:
            self.current.append("template", self.renderer.encode(suffix))
            self._awaiting_generation = True
        return self.current.tokens

    def trace(self) -> TokenTrace:
        for seq in self.sequences:
            seq.verify()
        return TokenTrace(list(self.sequences), self.restarts, list(self.restart_reasons), self.full_renders)

    # -- internals ----------------------------------------------------------------------

    def _track(self, message: dict[str, Any]) -> None:
        idx = len(self.messages)
        self.messages.append(message)
        role = message.get("role")
        if role == "user":
            self._last_user = idx
        elif role == "assistant":
            # `_prev_assistant` is the assistant turn *before* the newest one.
            self._prev_assistant = self._newest_assistant
            self._newest_assistant = idx

    def _new_sequence(self) -> None:
        text = self.renderer.render(self.messages, self.tools, add_generation_prompt=True)
        seq = TokenSequence()
        seq.append("prompt", self.renderer.encode(text))
        self.sequences.append(seq)
        self._awaiting_generation = True

    def _stand_in(self, a_idx: int, prev_assistant: int, last_user: int) -> list[dict[str, Any]]:
        """The last few messages ending with assistant turn `a_idx`: the system message, the last
        user message, the previous assistant turn with its results, and turn `a_idx`."""
        head: list[dict[str, Any]] = []
        if self.messages and self.messages[0].get("role") == "system":
            head.append(self.messages[0])
        start = max(prev_assistant, last_user + 1, 1 if head else 0)
        if 0 <= last_user < start:
            head.append(self.messages[last_user])
        return head + self.messages[start : a_idx + 1]

    def _suffix(
        self, a_idx: int, new: list[dict[str, Any]], gen: list[int], prev_assistant: int, last_user: int
    ) -> tuple[str | None, str]:
        window = self._stand_in(a_idx, prev_assistant, last_user)
        try:
            before = self.renderer.render(window, self.tools, add_generation_prompt=False)
            after = self.renderer.render(window + new, self.tools, add_generation_prompt=True)
        except Exception:
            # Some templates insist on a whole conversation (role alternation by index, a
            # first message of a given kind): render it all. Correct, but not flat; counted.
            self.full_renders += 1
            full = self.messages[: a_idx + 1]
            before = self.renderer.render(full, self.tools, add_generation_prompt=False)
            after = self.renderer.render(full + new, self.tools, add_generation_prompt=True)
        close = self.renderer.close
        # Compare text, not ids: the marker may tokenize differently inside a generation.
        produced = bool(gen) and self.renderer.decode(gen[-(len(close.ids) + 2) :]).endswith(close.text)
        return suffix_between(before, after, produced, close.text)


def suffix_between(before: str, after: str, produced_close: bool, close_text: str) -> tuple[str | None, str]:
    """Text to append after the model's ids, given renders ending with the assistant turn
    (`before`) and continuing past it (`after`), and whether the model's ids already end with
    the end-of-turn marker. Returns (None, reason) when the template is not append-only here."""
    if not after.startswith(before):
        i = next((k for k, (x, y) in enumerate(zip(before, after)) if x != y), min(len(before), len(after)))
        return None, (
            "template is not append-only: adding the new messages re-renders earlier text "
            f"(first difference at {i}: {before[i : i + 40]!r} -> {after[i : i + 40]!r})"
        )
    at = before.rfind(close_text)
    tail = before[at + len(close_text) :] if at >= 0 else None
    if tail is None or tail.strip():
        return None, f"template does not end the assistant turn with {close_text!r} (cannot place the model's tokens)"
    # A turn cut off by max_tokens (or a server that strips the stop token) still needs the
    # template's end-of-turn marker before the next message; it is not the model's token.
    return ("" if produced_close else close_text) + tail + after[len(before) :], ""
