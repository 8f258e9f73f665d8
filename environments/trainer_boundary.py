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
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx
from atroposlib.envs.base import BaseEnv, ScoredDataGroup

from environments.env_config import SplitSequences

__all__ = [
    "SplitSequences",
    "RunApiAnswer",
    "SendLedger",
    "RunApiBoundary",
    "check_trainer",
    "select_sequences",
    "post_group",
]

T = TypeVar("T")


def check_trainer(config: Any, *, poll_s: float = 1.0) -> dict[str, int]:
    """`serve`'s preflight, before any model server or worker starts: wait for a trainer to register
    with run-api, then refuse settings it cannot take. atroposlib checks the batch size only after
    registering (a traceback while the trainer polls on); run-api answers /info with -1 until a
    trainer has registered. Raises HermesEnvError (one line, exit 2); returns run-api's /info."""
    from environments.errors import HermesEnvError

    url = config.rollout_server_url.rstrip("/")
    said = False
    with httpx.Client(timeout=10) as http:
        while True:
            try:
                info = http.get(f"{url}/info").json()
            except (httpx.HTTPError, ValueError) as exc:
                raise HermesEnvError(
                    f"the rollout API at {url} does not answer /info ({type(exc).__name__}); start it with "
                    "`run-api --host 127.0.0.1 --port PORT` or pass --env.rollout_server_url"
                ) from None
            if int(info.get("batch_size", -1)) != -1:
                break
            if not said:
                print(f"[hermes-rl] serve: waiting for a trainer to register with {url}", file=sys.stderr)
                said = True
            time.sleep(poll_s)
    batch_size, max_len = int(info["batch_size"]), int(info.get("max_token_len", -1))
    if config.group_size > batch_size:
        raise HermesEnvError(
            f"the trainer at {url} takes batches of {batch_size} sequences, but a group here holds "
            f"--env.group_size {config.group_size} and must fit in one batch: start the trainer with a batch "
            f"size of at least {config.group_size} (training.grpo --batch_size {config.group_size}) or pass "
            f"--env.group_size {batch_size}"
        )
    if max_len != -1 and config.max_token_length > max_len:
        raise HermesEnvError(
            f"the trainer at {url} takes sequences of at most {max_len} tokens, but --env.max_token_length is "
            f"{config.max_token_length}: pass --env.max_token_length {max_len} or start the trainer with "
            f"a longer max_token_len"
        )
    return {"batch_size": batch_size, "max_token_len": max_len}


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


class RunApiBoundary:
    """The env's side of run-api in `serve` (mixed into HermesAgentBaseEnv, before BaseEnv): which
    groups are posted, one line per group with run-api's answer, and when `serve` stops."""

    # Set by HermesAgentBaseEnv.__init__ and atroposlib's BaseEnv.
    config: Any
    status_dict: dict[str, Any]
    workers: set[Any]
    max_token_len: int
    curr_step: int
    items_sent_this_step: int
    _ledger: SendLedger
    _groups_sent: int
    _start_step: int
    _trainer_done: asyncio.Event | None
    _sent_enough: asyncio.Event | None

    async def _serve(self) -> None:
        # atroposlib's loop stops only once the queue holds more than the remaining steps; a trainer
        # that took its last step with an empty queue would leave serve running, so that ends it too.
        # Once run-api holds every sequence the trainer's steps take, no more rollouts are started.
        self._trainer_done, self._sent_enough = asyncio.Event(), asyncio.Event()
        loop = asyncio.ensure_future(BaseEnv.env_manager(self))
        stops = [asyncio.ensure_future(e.wait()) for e in (self._trainer_done, self._sent_enough)]
        try:
            await asyncio.wait({loop, *stops}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (loop, *stops, *self.workers):
                task.cancel()
            await asyncio.gather(loop, *stops, *self.workers, return_exceptions=True)
        if loop.done() and not loop.cancelled():
            loop.result()  # raises what atroposlib's loop raised
        step = await self._wait_for_trainer() if self._sent_enough.is_set() else self.status_dict.get("current_step")
        print(
            f"[hermes-rl] serve: stopping: the trainer's run is done (step {step} of {self.config.total_steps}); "
            f"{self._ledger.summary}",
            file=sys.stderr,
        )

    async def _wait_for_trainer(self) -> int:
        """Poll run-api's /status until the trainer has taken its last step; returns that step."""
        print(
            "[hermes-rl] serve: run-api holds every sequence the trainer's steps take; waiting for it", file=sys.stderr
        )
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                response = await http.get(f"{self.config.rollout_server_url}/status")
                step = int(response.json()["current_step"])
                if step >= self.config.total_steps:
                    return step
                await asyncio.sleep(1)

    async def get_status(self):
        await super().get_status()
        if self._trainer_done is not None and self.status_dict.get("current_step", 0) >= self.config.total_steps:
            self._trainer_done.set()

    def _needs_met(self) -> bool:
        """Whether run-api has received every sequence the trainer's remaining steps take (alone on
        run-api this env must send them all; with other envs it sends fewer, so this stays False)."""
        needed = (self.config.total_steps - self._start_step) * self.config.batch_size
        return self.config.batch_size > 0 and self._ledger.received_sequences >= needed

    def _skip_reason(self, group: ScoredDataGroup, check_length: bool, serving: bool) -> str | None:
        """Why this group is not sent: atroposlib 0.4.0's handle_send_to_api checks, said aloud, and
        (serve) run-api's: it releases only groups of exactly the registered group_size."""
        n = len(group.get("tokens", []))
        overrides = group.get("group_overrides") or {}
        if serving and n != self.config.group_size:
            rollouts = len(set(overrides.get("sequence_rollouts", [])))
            if rollouts < self.config.group_size:
                why = "; ".join(group.get("left_out") or []) or "see --env.rollout_infra_retries"
                return (
                    f"{self.config.group_size - rollouts} of {self.config.group_size} rollouts lost to infrastructure "
                    f"errors, left out or dropped (run-api would buffer a short group; {why})"
                )
            return f"{n} sequences where run-api expects group_size {self.config.group_size}"
        if serving and self._needs_met():
            return f"the trainer's run needs no more ({self._ledger.received_sequences} sequences received)"
        expected = overrides.get("group_size", self.config.group_size)
        if n != expected:
            return f"{n} sequences where the group size is {expected}"
        if self.config.ensure_scores_are_not_same and len(set(group["scores"])) == 1:
            return "all scores equal, no learning signal (--env.ensure_scores_are_not_same)"
        if check_length and self.max_token_len > 0 and any(len(t) >= self.max_token_len for t in group["tokens"]):
            return f"a sequence reaches the trainer's max_token_len {self.max_token_len}"
        return None

    async def handle_send_to_api(
        self, scored_data, item=None, do_send_to_api=True, abort_on_any_max_length_exceeded=True
    ):
        """One line per group, printed once its fate is known: written, what run-api answered to the
        POST, or not sent and why. atroposlib's own path keeps its bookkeeping (wandb, groups file);
        the POST is ours, because atroposlib's logs and drops what run-api answers."""
        for group in scored_data if isinstance(scored_data, list) else [scored_data]:
            if group is None:
                continue
            scores = "[" + ", ".join(f"{s:.2f}" for s in group["scores"]) + "]"
            reason = self._skip_reason(group, abort_on_any_max_length_exceeded, serving=do_send_to_api)
            if reason is not None:
                self._ledger.skip(reason)
                print(f"[hermes-rl] group not sent: {reason}; scores {scores}", file=sys.stderr)
                continue
            await super().handle_send_to_api(group, item, False, abort_on_any_max_length_exceeded)
            if not do_send_to_api:
                total = getattr(self, "n_groups_to_process", "?")
                print(f"[hermes-rl] group {self.curr_step + 1}/{total}: written; scores {scores}", file=sys.stderr)
                continue
            group["env_id"] = getattr(self, "env_id", None)
            async with httpx.AsyncClient(timeout=60) as http:
                answer = await post_group(http, f"{self.config.rollout_server_url}/scored_data", group)
            self._ledger.record(answer, len(group["tokens"]))
            if self._sent_enough is not None and self._needs_met():
                self._sent_enough.set()
            if answer.status == "received":
                self._groups_sent += 1
                self.items_sent_this_step += 1
                print(
                    f"[hermes-rl] group {self._groups_sent} sent to the trainer: {answer.line}; scores {scores}",
                    file=sys.stderr,
                )
            else:
                print(f"[hermes-rl] group not released to the trainer: {answer.line}; scores {scores}", file=sys.stderr)
