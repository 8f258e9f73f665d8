"""Harbor's reward files read as Harbor's verifier reads them (harbor-framework/harbor
src/harbor/verifier/verifier.py `Verifier.verify`, `_parse_reward_json`, `_parse_reward_text`; metrics/base.py).

- `reward.json` is read when it exists, else `reward.txt`; neither is a trial error (`RewardFileNotFoundError`),
  not a score of 0;
- an empty file (0 bytes) is a trial error (`RewardFileEmptyError`), and so is content that does not parse
  (`VerifierOutputParseError`): `float()` of reward.txt's text, a JSON object for reward.json;
- `reward.txt` is `{"reward": value}`; `reward.json` keeps every numeric key (booleans are not numbers);
- the value is the raw float: no clamping (2.0 stays 2.0, -1 stays -1).

The headline reward (what a trainer gets) is what Harbor's aggregation takes: the only value when there is one key
(`aggregate_reward_dicts` uses `next(iter(r.values()))` whatever its name), the `reward` key when present among
several (Harbor's standard key). With several keys and none named `reward` Harbor keeps each key as its own
metric and has no single score: a trial error here too, naming the keys. A value that is not finite (NaN, inf)
cannot be a training signal: a trial error (Harbor would carry it into its means).

One implementation for every path that reads the files (the slot verifier's verdict block, a task container's
/logs/verifier): `read_rewards` takes the two files' bytes, or None for a file that is not there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

__all__ = ["RewardFiles", "RewardError", "read_rewards"]


class RewardError(ValueError):
    """No usable reward: a trial (verifier) error, never a score of 0."""


@dataclass(frozen=True)
class RewardFiles:
    reward: float  # the headline reward, raw
    metrics: dict[str, float]  # every numeric key of the file read
    source: str  # "reward.json" or "reward.txt"


def _text(data: bytes) -> dict[str, float]:
    if not data:
        raise RewardError("reward.txt is empty")
    text = data.decode(errors="replace")
    try:
        return {"reward": float(text)}
    except ValueError:
        raise RewardError(f"reward.txt is not a number: {text.strip()[:40]!r}") from None


def _json(data: bytes) -> dict[str, float]:
    if not data:
        raise RewardError("reward.json is empty")
    try:
        parsed = json.loads(data)
    except ValueError:
        raise RewardError("reward.json is not JSON") from None
    if not isinstance(parsed, dict):
        raise RewardError(f"reward.json is not a JSON object but {type(parsed).__name__}")
    return {
        k: float(v)
        for k, v in parsed.items()
        if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def read_rewards(reward_json: bytes | None, reward_txt: bytes | None) -> RewardFiles:
    """The rewards of a verifier run from its reward files' contents (None: that file is absent)."""
    if reward_json is not None:
        metrics, source = _json(reward_json), "reward.json"
    elif reward_txt is not None:
        metrics, source = _text(reward_txt), "reward.txt"
    else:
        raise RewardError("tests/test.sh wrote no reward file (neither reward.json nor reward.txt)")
    if "reward" in metrics:
        headline = metrics["reward"]
    elif len(metrics) == 1:
        headline = next(iter(metrics.values()))
    elif not metrics:
        raise RewardError(f"{source} holds no numeric value")
    else:
        raise RewardError(f"{source} has several metrics and no 'reward' key to score by: {sorted(metrics)}")
    if not math.isfinite(headline):
        raise RewardError(f"{source}: the reward is {headline}, not a finite number")
    return RewardFiles(reward=headline, metrics=metrics, source=source)
