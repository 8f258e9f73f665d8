"""A GSM8k answer written to be ruinous to parse scores 0 and stalls nothing.

math-verify hands `\\boxed{9^{9^{9^9}}}` to sympy, which starts on an integer with hundreds of
millions of digits: C code no timeout interrupts. Checked on the event loop, it froze every
trajectory of the process. Both rollouts here go through the env and the real agent loop.
"""

from __future__ import annotations

import asyncio
import time

from environments.gsm8k.data import gold_answer
from environments.gsm8k.env import GSM8kAgentEnv
from environments.models.base import ModelTurn

RUINOUS = "\\boxed{9^{9^{9^{9}}}}"


class Answers:
    """Answers at once with a fixed text, without calling a tool."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def chat(self, messages, tools, options) -> ModelTurn:
        return ModelTurn(content=self.text)


async def test_a_ruinous_answer_scores_zero_and_honest_rollouts_go_on(tmp_path):
    config, servers = GSM8kAgentEnv.config_init()
    config = config.model_copy(
        update={"data_path_to_save_groups": str(tmp_path / "g.jsonl"), "answer_check_timeout_s": 5.0}
    )
    env = GSM8kAgentEnv(config, servers)
    await env.setup()
    item = await env.get_next_item()
    honest = f"\\boxed{{{gold_answer(item['answer'])}}}"
    async with env.runtime(model=lambda: Answers(honest)):
        # two at once start both checker workers, so the timing below is the checks' own
        await asyncio.gather(env.rollout(item), env.rollout(item))
        hostile_task = asyncio.ensure_future(env.rollout(item, model=Answers(RUINOUS)))
        await asyncio.sleep(0.5)  # the hostile check is running
        started = time.monotonic()
        honest_rollout = await env.rollout(item)
        honest_s = time.monotonic() - started
        hostile = await asyncio.wait_for(hostile_task, 60)
        workers = list(env.answer_check._all)
    assert honest_rollout.score == 1.0 and honest_s < 4.0  # not queued behind the hostile check
    assert hostile.score == 0.0 and hostile.error is None and not hostile.infrastructure_failure
    assert hostile.duration_s < 30
    assert all(p.returncode is not None for p in workers)  # the runtime's end stopped every worker
