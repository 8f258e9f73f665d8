"""Scored groups as a trainer receives them, and what their `inference_logprobs` describe.

A group is atroposlib's `ScoredData`: per sequence `tokens`, `masks` (the token id where the
model's own token is trained, -100 elsewhere), `inference_logprobs` (aligned with `tokens`;
atroposlib's 1.0 marker where there is none) and a score. Two sources write them:

- an env's `process` JSONL: one group per line;
- run-api's `GET /batch`: `{"batch": [group, ...]}`; saved as JSON or JSONL, one response or
  one batch (a list of groups) per line.

`generation_params` is the one field run-api keeps that says how a group was sampled. When it
carries a sampling record (`logprobs`: which distribution; `temperature`, `top_k`, `top_p`,
`min_p`; `missing_logprobs`: trained positions the server gave no logprob for) it is honoured;
without one the logprobs are taken as llama.cpp's and vLLM's default: the log-softmax of the
raw logits (temperature 1, before any truncation).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.jsonl import jsonl_lines
from environments.models.token_mode.session import NOT_SAMPLED  # atroposlib's "no logprob here" marker (1.0)
from environments.models.token_mode.wiring import LOGPROB_SEMANTICS  # the record's words for each distribution

__all__ = ["NOT_SAMPLED", "Group", "LogprobSemantics", "read_groups", "parse_groups", "trained_positions", "turns"]

IGNORE = -100  # masks: not trained


@dataclass(frozen=True)
class LogprobSemantics:
    """Which distribution a group's inference_logprobs are log-probabilities under."""

    kind: str = "raw_logits"  # raw_logits: log_softmax(logits) | sampling_policy: after temperature + truncation
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    declared_gaps: int | None = None  # trained positions the record says have no logprob (None: no record)

    @classmethod
    def from_generation_params(cls, params: dict[str, Any] | None) -> LogprobSemantics:
        if not params or "logprobs" not in params:
            return cls()
        described = params["logprobs"]
        if described is None:
            raise ValueError(
                "this group was made in chat mode (generation_params.logprobs is null): it has no "
                "inference_logprobs to check or to train against; use a token server (--env.runtime.token_server)"
            )
        gaps = params.get("missing_logprobs")
        declared = sum(gaps.get("per_sequence") or []) if isinstance(gaps, dict) else None
        if described == LOGPROB_SEMANTICS["sampling_policy"]:
            return cls(
                "sampling_policy",
                float(params.get("temperature") or 1.0),
                int(params.get("top_k") or 0),
                float(params.get("top_p") if params.get("top_p") is not None else 1.0),
                float(params.get("min_p") or 0.0),
                declared,
            )
        return cls(declared_gaps=declared)


@dataclass(frozen=True)
class Group:
    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    inference_logprobs: list[list[float]] | None
    semantics: LogprobSemantics
    advantages: list[list[float]] | None = None
    source: str = ""  # "file:line" for messages
    # Which rollout each sequence is from (group_overrides.sequence_rollouts): a rollout that
    # spans several token sequences counts once in the group's baseline (docs/trainers.md).
    sequence_rollouts: list[int] | None = None

    @classmethod
    def from_dict(cls, row: dict[str, Any], source: str) -> Group:
        try:
            tokens, masks, scores = row["tokens"], row["masks"], row["scores"]
        except KeyError as exc:
            raise ValueError(
                f"{source}: a scored group needs tokens, masks and scores; {exc.args[0]!r} is missing"
            ) from None
        logprobs = row.get("inference_logprobs")
        lengths = {len(tokens), len(masks), len(scores)} | ({len(logprobs)} if logprobs is not None else set())
        if len(lengths) != 1:
            raise ValueError(f"{source}: tokens/masks/scores/inference_logprobs hold different numbers of sequences")
        for i, (t, m) in enumerate(zip(tokens, masks)):
            if len(t) != len(m) or (logprobs is not None and len(logprobs[i]) != len(t)):
                raise ValueError(
                    f"{source}: sequence {i} has tokens, masks and inference_logprobs of different lengths"
                )
        semantics = LogprobSemantics.from_generation_params(row.get("generation_params"))
        rollouts = (row.get("group_overrides") or {}).get("sequence_rollouts")
        if rollouts is not None:
            if len(rollouts) != len(tokens) or not all(isinstance(r, int) for r in rollouts):
                raise ValueError(f"{source}: group_overrides.sequence_rollouts needs one rollout index per sequence")
            by_rollout: dict[int, float] = {}
            for r, score in zip(rollouts, scores):
                if by_rollout.setdefault(r, float(score)) != float(score):
                    raise ValueError(f"{source}: the sequences of rollout {r} carry different scores")
        scores = [float(s) for s in scores]
        return cls(tokens, masks, scores, logprobs, semantics, row.get("advantages"), source, rollouts)

    def __len__(self) -> int:
        return len(self.tokens)


def parse_groups(obj: Any, source: str) -> Iterator[Group]:
    """Groups in one decoded JSON value: a group, a batch (list of groups) or a /batch response."""
    if isinstance(obj, dict) and "batch" in obj:
        if obj["batch"] is None:
            return
        obj = obj["batch"]
    if isinstance(obj, list):
        for i, row in enumerate(obj):
            yield from parse_groups(row, f"{source}[{i}]")
    elif isinstance(obj, dict):
        yield Group.from_dict(obj, source)
    else:
        raise ValueError(f"{source}: expected a scored group, a list of them or a run-api /batch response")


def read_groups(path: Path) -> list[Group]:
    """Groups of a `process` JSONL or of saved run-api batches (JSON or JSONL)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return list(parse_groups(json.loads(text), str(path)))  # one JSON document
    except json.JSONDecodeError:
        pass
    groups: list[Group] = []
    for n, line in jsonl_lines(text):
        groups.extend(parse_groups(json.loads(line), f"{path}:{n}"))
    return groups


def trained_positions(masks: list[int]) -> list[int]:
    """Positions whose token is trained. Position 0 has no context to predict it from, so it never is."""
    return [i for i, m in enumerate(masks) if m != IGNORE and i > 0]


def turns(masks: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of trained positions: one per assistant turn."""
    spans, start = [], None
    for i, m in enumerate([*masks, IGNORE]):
        if m != IGNORE and start is None:
            start = i
        elif m == IGNORE and start is not None:
            spans.append((start, i))
            start = None
    return spans
