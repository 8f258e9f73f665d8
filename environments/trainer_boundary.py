"""The boundary between scored groups and a trainer: which sequences a group carries, and what
run-api answered for each group `serve` posts.

atroposlib 0.4.0's run-api (`api/server.py` `_process_scored_data`) queues a group for the trainer
only when it holds exactly the registered `group_size` sequences; any other size is buffered until
buffered sizes add up to `group_size` exactly (`api/utils.py` `find_groups_summing_to_target`), which
may never happen. So `serve` posts only complete groups, and says for each what run-api answered.

A rollout spans several token sequences when the chat template is not append-only (Qwen3 renders
an assistant turn differently once a tool result follows). `--env.split_sequences` picks what a
group carries (docs/trainers.md):

- `last` (default): one sequence per rollout, the rollout's last one; it holds the whole
  conversation as context and trains the turns generated after the last split. Groups keep
  exactly `group_size` sequences, which run-api releases.
- `all`: every sequence, each with its rollout's score; `group_overrides.sequence_rollouts`
  says which rollout each belongs to (training.grpo computes one advantage per rollout). Groups
  then vary in size, which run-api buffers: `process` output only; `serve` refuses it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx

__all__ = ["SplitSequences", "RunApiAnswer", "SendLedger", "select_sequences", "post_group"]

SplitSequences = Literal["last", "all"]
T = TypeVar("T")


def select_sequences(items: list[T], policy: SplitSequences) -> list[T]:
    """The sequences of one rollout that go into its group."""
    if policy == "last" and len(items) > 1:
        return items[-1:]
    return items


@dataclass(frozen=True)
class RunApiAnswer:
    """What run-api said about one posted group: received (queued for the trainer), buffered, or an error."""

    status: Literal["received", "buffered", "error"]
    detail: str

    @property
    def line(self) -> str:
        return f"run-api {self.status}" + (f" ({self.detail})" if self.detail else "")


async def post_group(
    http: httpx.AsyncClient, url: str, group: dict[str, Any], *, attempts: int = 3, backoff_s: float = 1.0
) -> RunApiAnswer:
    """POST one group to run-api's /scored_data; 5xx and connection errors are retried (bounded)."""
    last = ""
    for attempt in range(attempts):
        if attempt:
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            response = await http.post(url, json=group)
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code >= 500:
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            continue
        if response.status_code >= 400:
            return RunApiAnswer("error", f"HTTP {response.status_code}: {response.text[:200]}")
        try:
            body = response.json()
        except ValueError:
            return RunApiAnswer("error", f"an answer that is not JSON: {response.text[:200]}")
        status = body.get("status") if isinstance(body, dict) else None
        if status == "received":
            return RunApiAnswer("received", "")
        if status == "buffered":
            return RunApiAnswer("buffered", f"{body.get('buffer_size')} sequences wait for a partner group")
        return RunApiAnswer("error", f"unexpected answer {str(body)[:200]}")
    return RunApiAnswer("error", f"after {attempts} attempts: {last}")


@dataclass
class SendLedger:
    """Every scored group `serve` finished: sent and received, buffered, or not sent and why."""

    received_groups: int = 0
    received_sequences: int = 0
    buffered_groups: int = 0
    not_sent: Counter[str] = field(default_factory=Counter)  # reason -> groups

    def record(self, answer: RunApiAnswer, sequences: int) -> None:
        if answer.status == "received":
            self.received_groups += 1
            self.received_sequences += sequences
        elif answer.status == "buffered":
            self.buffered_groups += 1
        else:
            self.not_sent[f"run-api error: {answer.detail}"] += 1

    def skip(self, reason: str) -> None:
        self.not_sent[reason] += 1

    @property
    def summary(self) -> str:
        not_sent = sum(self.not_sent.values())
        text = (
            f"{self.received_groups} groups ({self.received_sequences} sequences) received by run-api, "
            f"{self.buffered_groups} buffered, {not_sent} not sent"
        )
        if not_sent:
            text += ": " + "; ".join(f"{n} x {reason}" for reason, n in self.not_sent.most_common())
        return text
