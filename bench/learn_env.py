"""The task bench/learn.py trains on: GSM8k's problems without tools, reward for a brief final answer.

The 135M model almost never solves a GSM8k problem, so the correctness reward gives a handful
of steps nothing to climb. Brevity is a behaviour it can change quickly (end the answer earlier)
and gives every group different scores: the reward is 1 - words/50 of the final reply (0 for 50
words or more, or no final reply). Run like any env: `python -m bench.learn_env serve|evaluate ...`.
"""

from __future__ import annotations

from environments.gsm8k.env import GSM8kAgentEnv

WORDS_FOR_ZERO = 50


class BriefAnswerEnv(GSM8kAgentEnv):
    name = "gsm8k_brief"
    # No tools and a one-line system prompt: ~100-token sequences keep a CPU step short.
    default_toolsets: list[str] = []
    default_system_prompt = "Answer the question."

    async def compute_reward(self, item, result, ctx) -> float:
        words = len((result.final_response or "").split())
        if words == 0:
            return 0.0
        return max(0.0, 1.0 - words / WORDS_FOR_ZERO)


if __name__ == "__main__":
    BriefAnswerEnv.cli()
