"""GSM8k on the embedded model with a reward that tells samples apart (a test env).

The 135M model almost never answers a GSM8k question, so every sample would score 0 and a
GRPO step would have no advantage to learn from (atroposlib also drops equal-score groups).
Here the reward is a stable hash of what the model said, in [0, 1]: two different samples
almost surely score differently. Run like any env: `python -m tests.training.hash_reward_env serve ...`.
"""

from __future__ import annotations

import hashlib
import json

from environments.gsm8k.env import GSM8kAgentEnv


class HashRewardEnv(GSM8kAgentEnv):
    name = "gsm8k_hash_reward"

    async def compute_reward(self, item, result, ctx) -> float:
        said = [
            [m.get("content"), [c["function"] for c in m.get("tool_calls") or []]]
            for m in result.messages
            if m.get("role") == "assistant"
        ]
        digest = hashlib.sha256(json.dumps(said, sort_keys=True).encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32


if __name__ == "__main__":
    HashRewardEnv.cli()
