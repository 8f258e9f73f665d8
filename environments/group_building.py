"""One rollout and one group, shared by `process`, `serve` and `evaluate`: the model client of a
trajectory (gated per server), the rollout through the runtime, infrastructure retries, and the
scored group (token ids, masks, logprobs, what was left out and why)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, final

from atroposlib.envs.base import ScoredDataGroup

from environments.agent_loop import AgentLoopConfig, AgentResult
from environments.models.base import ChatModel, ModelError, ModelTurn, TurnOptions
from environments.models.chat_tokens import tokenize_conversation
from environments.models.token_mode.wiring import finish_logprobs, trace_items
from environments.rollout_settings import RolloutSettings
from environments.runtime import HermesEnvError, Rollout
from environments.trainer_boundary import SendLedger, select_sequences
from tools.context import ToolContext

__all__ = ["BoundedModel", "GroupBuilding"]

logger = logging.getLogger(__name__)


class BoundedModel:
    """A ChatModel whose requests wait for a slot of their server's gate (atroposlib's
    `num_max_requests_at_once` / `num_requests_for_eval`, applied to our own clients)."""

    def __init__(self, inner: ChatModel, gate: asyncio.Semaphore, on_close: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.gate = gate
        self._on_close = on_close

    def close(self) -> None:
        """The trajectory is over: its server has one trajectory less in flight."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], options: TurnOptions
    ) -> ModelTurn:
        async with self.gate:
            return await self.inner.chat(messages, tools, options)

    def token_trace(self) -> Any:
        trace = getattr(self.inner, "token_trace", None)
        return trace() if callable(trace) else None


class GroupBuilding(RolloutSettings):
    """Rollouts and groups (mixed into HermesAgentBaseEnv)."""

    # Set by HermesAgentBaseEnv.__init__ (tokenizer: atroposlib's BaseEnv).
    tokenizer: Any
    _request_gates: list[tuple[asyncio.Semaphore, asyncio.Semaphore]]
    _fatal: HermesEnvError | None
    _fatal_event: asyncio.Event | None
    _consecutive_infra_failures: int
    _ledger: SendLedger
    rollouts_done: int

    def make_model(self, for_eval: bool = False) -> ChatModel:
        """A model client for one trajectory on the healthy server with the most free request slots
        (environments/server_options.py), bounded by that server's `num_max_requests_at_once`
        (`num_requests_for_eval` for evaluation)."""
        slot = 1 if for_eval else 0
        router = self.agent_runtime.router
        if router is None:  # outside the runtime, or an injected model: round-robin as before
            model = self.agent_runtime.make_model()
            return BoundedModel(model, self._request_gates[self.agent_runtime.last_server_index][slot])
        capacity = [
            getattr(c, "num_requests_for_eval" if for_eval else "num_max_requests_at_once") for c in self.server_configs
        ]
        index = router.acquire(capacity)
        model = self.agent_runtime.make_model(index)
        return BoundedModel(model, self._request_gates[index][slot], on_close=lambda: router.release(index))

    def initial_messages(self, item: Any) -> list[dict[str, Any]]:
        prompt = self.format_prompt(item)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        system = self.config.system_prompt or self.default_system_prompt
        if system and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    @final
    async def rollout(
        self,
        item: Any,
        *,
        model: ChatModel | None = None,
        loop_config: AgentLoopConfig | None = None,
        for_eval: bool = False,
    ) -> Rollout:
        """One trajectory through the runtime: workspace -> agent loop -> compute_reward."""

        async def setup(ctx: ToolContext) -> None:
            await self.setup_trajectory_workspace(item, ctx)

        async def score(result: AgentResult, ctx: ToolContext) -> float:
            return await self.compute_reward(item, result, ctx)

        chosen = model or self.make_model(for_eval)
        try:
            rollout = await self.agent_runtime.rollout(
                self.initial_messages(item),
                self.tool_schemas(),
                item=item,
                setup=setup,
                score=score,
                loop=self.item_loop_config(item, loop_config or self.loop_config()),
                model=chosen,
                task_id=f"{type(self).__name__}-{uuid.uuid4().hex[:10]}",
                workspace=lambda task_id: self.open_workspace(item, task_id),
                agent=self.agent_factory(item, for_eval),
            )
        finally:
            if isinstance(chosen, BoundedModel):
                chosen.close()
        if not rollout.infrastructure_failure and rollout.result is not None:
            self.rollouts_done += 1
            # Progress inside long groups: one line per finished rollout.
            print(
                f"[hermes-rl]   rollout done: score {rollout.score if rollout.score is not None else float('nan'):.2f}, "
                f"{rollout.result.stop_reason}, {rollout.result.turns_used} turns, {rollout.duration_s:.1f}s",
                file=sys.stderr,
            )
        return rollout

    async def collect_trajectories(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        try:
            return await self._collect(item)
        except HermesEnvError as exc:
            self._set_fatal(exc)
            raise

    async def _model_server_came_back(self) -> bool:
        """True when a model server did not answer and then answered again within server_down_wait_s."""
        runtime = self.agent_runtime
        deadline = time.monotonic() + self.config.server_down_wait_s
        was_down = False
        while True:
            try:
                await asyncio.gather(*(runtime.probe(i) for i in range(len(runtime.servers))))
                return was_down
            except (HermesEnvError, ModelError):  # the probe's "does not answer" (chat or token protocol)
                was_down = True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(1.0)

    async def _collect(self, item: Any) -> tuple[ScoredDataGroup | None, list[Any]]:
        rollouts = list(await asyncio.gather(*(self.rollout(item) for _ in range(self.config.group_size))))
        for _ in range(self.config.rollout_infra_retries):
            redo = [i for i, r in enumerate(rollouts) if r.infrastructure_failure]
            if not redo or len(redo) == len(rollouts):  # all failed: likely down; the group is retried later
                break
            for i, r in zip(redo, await asyncio.gather(*(self.rollout(item) for _ in redo))):
                rollouts[i] = r
        usable = [r for r in rollouts if not r.infrastructure_failure]
        failed = [r for r in rollouts if r.infrastructure_failure]
        if failed:
            logger.warning("%d/%d rollouts hit infrastructure errors: %s", len(failed), len(rollouts), failed[0].error)
        if not usable:
            if await self._model_server_came_back():
                # A restart (training.grpo --sync reloading weights): the group is redone, and not counted.
                print(
                    f"[hermes-rl] model server was down and answers again; group retried: {failed[0].error}",
                    file=sys.stderr,
                )
                return None, [item]
            self._consecutive_infra_failures += 1
            if self._consecutive_infra_failures >= self.config.max_consecutive_infra_failures:
                raise HermesEnvError(
                    f"{self._consecutive_infra_failures} groups in a row failed on infrastructure errors; last: {failed[0].error}"
                )
            print(f"[hermes-rl] group lost to infrastructure errors, retried later: {failed[0].error}", file=sys.stderr)
            return None, [item]  # retried later, never scored as the model's failure
        self._consecutive_infra_failures = 0
        group = self.build_group(usable)
        if not group["tokens"]:  # every rollout's data was unusable: skip the item, say why
            reason = "; ".join(group.get("left_out") or ["no token sequences"])
            self._ledger.skip(reason)
            print(f"[hermes-rl] group not sent: {reason}", file=sys.stderr)
            return None, []
        return group, []

    def build_group(self, rollouts: list[Rollout]) -> ScoredDataGroup:
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], messages=[])
        info: list[dict[str, Any]] = []
        logprobs: list[list[float]] = []
        gaps: list[int] = []
        dropped = 0
        left_out: list[str] = []
        tools = self.tool_schemas()
        sequence_rollouts: list[int] = []
        for index, r in enumerate(rollouts):
            assert r.result is not None and r.score is not None
            trace = r.extras.get("token_trace")
            try:
                if trace is not None:  # token mode: exact ids; one item per token sequence
                    produced = trace_items(trace)
                else:
                    prompt_len = len(self.initial_messages(r.item))
                    produced = [(*tokenize_conversation(self.tokenizer, r.result.messages, tools, prompt_len), None)]
            except Exception as exc:  # one rollout's unusable data is its own error, never the command's
                left_out.append(f"{type(exc).__name__}: {exc}")
                logger.warning("a rollout was left out of its group: its tokens could not be built (%s)", left_out[-1])
                continue
            items = select_sequences(produced, self.config.split_sequences)
            for tokens, masks, raw_logprobs in items:
                if raw_logprobs is not None:
                    finished = finish_logprobs(masks, raw_logprobs, self.config.missing_logprobs)
                    if finished is None:
                        dropped += 1
                        continue
                    masks, item_logprobs, n_gaps = finished
                    logprobs.append(item_logprobs)
                    gaps.append(n_gaps)
                group["tokens"].append(tokens)
                group["masks"].append(masks)
                group["scores"].append(r.score)
                sequence_rollouts.append(index)
                group["messages"].append(r.result.messages)
                info.append(
                    {
                        "stop_reason": r.result.stop_reason,
                        "turns": r.result.turns_used,
                        "tool_calls": r.result.tool_call_count,
                        "tool_errors": len(r.result.tool_errors),
                        "duration_s": round(r.duration_s, 3),
                        "token_sequences": len(produced),
                        "rollout": index,  # which of the rollouts: some may be left out, some give several sequences
                    }
                )
        # Not `overrides`: trainers read that key as per-item training overrides. (run-api drops it.)
        group["rollout_info"] = info
        if left_out:
            group["left_out"] = left_out  # why rollouts are missing (not an infrastructure failure)
        # The offered tools, so exports (OpenAI messages + tools, SFT sets) are self-contained.
        group["tools"] = tools
        if logprobs and len(logprobs) == len(group["tokens"]):
            group["inference_logprobs"] = logprobs
        # run-api keeps `generation_params`: the one place a trainer sees how the group was sampled.
        record = dict(self.sampling_record)
        if gaps or dropped:
            record["missing_logprobs"] = {
                "per_sequence": gaps,
                "policy": self.config.missing_logprobs,
                "dropped": dropped,
            }
            if any(gaps) or dropped:
                logger.warning(
                    "%d trained tokens without a logprob (--env.missing_logprobs %s; %d sequences dropped)",
                    sum(gaps),
                    self.config.missing_logprobs,
                    dropped,
                )
        group["generation_params"] = record
        # run-api keeps group_overrides (it drops unknown keys): which rollout each sequence is
        # from, so a trainer gives all sequences of one rollout one advantage (docs/trainers.md).
        overrides: dict[str, Any] = {"sequence_rollouts": sequence_rollouts, "rollouts": len(rollouts)}
        if len(group["tokens"]) != self.config.group_size:
            # Split sequences (split_sequences all), or rollouts lost to infrastructure: tell
            # atroposlib the real size, or it drops the group as malformed. serve never sends these.
            overrides["group_size"] = len(group["tokens"])
        group["group_overrides"] = overrides
        return group

    def _set_fatal(self, exc: HermesEnvError) -> None:
        if self._fatal is None:
            self._fatal = exc
        if self._fatal_event is not None:
            self._fatal_event.set()
