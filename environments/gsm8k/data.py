"""GSM8K-format problems: the real dataset through `datasets`, or an offline generator.

Every item has `question` and `answer`, where `answer` is a worked solution whose last
line is `#### N` (GSM8K's own format). The generator is seeded and deterministic, so
the offline default needs no network and gives the same problems every run.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

__all__ = ["synthetic_gsm8k", "load_gsm8k", "gold_answer"]

_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonah", "Kira", "Luis"]
_ITEMS = [("apples", "apple"), ("marbles", "marble"), ("stickers", "sticker"), ("books", "book"), ("cookies", "cookie")]


def _shopping(rng: random.Random) -> dict[str, str]:
    name = rng.choice(_NAMES)
    n, price, paid = rng.randint(3, 12), rng.randint(2, 9), 0
    cost = n * price
    paid = cost + rng.randint(1, 20)
    change = paid - cost
    plural, _ = rng.choice(_ITEMS)
    q = (
        f"{name} buys {n} {plural} that cost ${price} each. {name} pays with ${paid}. "
        f"How many dollars of change does {name} get?"
    )
    a = (
        f"The {plural} cost {n} * {price} = <<{n}*{price}={cost}>>{cost} dollars.\n"
        f"The change is {paid} - {cost} = <<{paid}-{cost}={change}>>{change} dollars.\n#### {change}"
    )
    return {"question": q, "answer": a}


def _sharing(rng: random.Random) -> dict[str, str]:
    name, friend = rng.sample(_NAMES, 2)
    per, boxes = rng.randint(4, 15), rng.randint(2, 9)
    total = per * boxes
    given = rng.randint(1, total - 1)
    left = total - given
    plural, _ = rng.choice(_ITEMS)
    q = (
        f"{name} has {boxes} boxes with {per} {plural} in each box. "
        f"{name} gives {given} {plural} to {friend}. How many {plural} does {name} have left?"
    )
    a = (
        f"{name} has {boxes} * {per} = <<{boxes}*{per}={total}>>{total} {plural}.\n"
        f"After giving some away: {total} - {given} = <<{total}-{given}={left}>>{left}.\n#### {left}"
    )
    return {"question": q, "answer": a}


def _rate(rng: random.Random) -> dict[str, str]:
    name = rng.choice(_NAMES)
    speed, hours, extra = rng.randint(20, 70), rng.randint(2, 6), rng.randint(5, 40)
    dist = speed * hours
    total = dist + extra
    q = (
        f"{name} drives at {speed} miles per hour for {hours} hours, then walks {extra} more miles. "
        f"How many miles does {name} travel in total?"
    )
    a = (
        f"Driving: {speed} * {hours} = <<{speed}*{hours}={dist}>>{dist} miles.\n"
        f"Total: {dist} + {extra} = <<{dist}+{extra}={total}>>{total} miles.\n#### {total}"
    )
    return {"question": q, "answer": a}


def _savings(rng: random.Random) -> dict[str, str]:
    name = rng.choice(_NAMES)
    weekly, weeks, spent = rng.randint(5, 30), rng.randint(3, 12), 0
    saved = weekly * weeks
    spent = rng.randint(1, saved // 2)
    left = saved - spent
    q = (
        f"{name} saves ${weekly} every week for {weeks} weeks and then spends ${spent} on a gift. "
        f"How much money does {name} have left?"
    )
    a = (
        f"Saved: {weekly} * {weeks} = <<{weekly}*{weeks}={saved}>>{saved} dollars.\n"
        f"Left: {saved} - {spent} = <<{saved}-{spent}={left}>>{left} dollars.\n#### {left}"
    )
    return {"question": q, "answer": a}


_TEMPLATES: list[Callable[[random.Random], dict[str, str]]] = [_shopping, _sharing, _rate, _savings]


def synthetic_gsm8k(n: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` GSM8K-format problems, the same for the same seed."""
    rng = random.Random(seed)
    return [_TEMPLATES[i % len(_TEMPLATES)](rng) for i in range(n)]


def load_gsm8k(split: str) -> list[dict[str, str]]:
    """The real dataset from the Hugging Face hub (needs network the first time)."""
    from datasets import load_dataset

    ds = load_dataset("openai/gsm8k", "main", split=split)
    return [{"question": row["question"], "answer": row["answer"]} for row in ds]


_GOLD = re.compile(r"####\s*([-\d,.\s]+)\s*$")


def gold_answer(answer: str) -> str:
    """The number after `####`, without thousands separators."""
    m = _GOLD.search(answer.strip())
    if not m:
        raise ValueError(f"GSM8K answer has no '#### N' line: {answer[-80:]!r}")
    return m.group(1).replace(",", "").strip()
