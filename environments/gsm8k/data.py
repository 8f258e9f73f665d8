"""GSM8K-format problems: an offline generator, a hub dataset through `datasets`, or a local file.

Every item has `question` and `answer`, where `answer` is a worked solution whose last
line is `#### N` (GSM8K's own format, as in openai/gsm8k). The generator is seeded and
deterministic, so the offline default needs no network and gives the same problems every run.
A local source is a JSONL file of such rows or a directory written by `datasets`' `save_to_disk`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

from environments.jsonl import jsonl_rows

__all__ = ["synthetic_gsm8k", "load_gsm8k", "load_local_gsm8k", "dataset_kind", "gold_answer", "OFFLINE_NAMES"]

OFFLINE_NAMES = ("synthetic", "offline")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")

_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonah", "Kira", "Luis"]
_ITEMS = [("apples", "apple"), ("marbles", "marble"), ("stickers", "sticker"), ("books", "book"), ("cookies", "cookie")]


Step = tuple[str, int, str, int, int, str]  # lead, a, operator, b, result, unit


def _problem(question: str, *steps: Step) -> dict[str, str]:
    """A row whose answer works `steps` out in GSM8K's calculator notation (`<<a*b=c>>c`), then `#### N`."""
    lines = [f"{lead}{a} {op} {b} = <<{a}{op}{b}={r}>>{r}{unit}." for lead, a, op, b, r, unit in steps]
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {steps[-1][4]}"}


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
    return _problem(
        q,
        (f"The {plural} cost ", n, "*", price, cost, " dollars"),
        ("The change is ", paid, "-", cost, change, " dollars"),
    )


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
    return _problem(
        q,
        (f"{name} has ", boxes, "*", per, total, f" {plural}"),
        ("After giving some away: ", total, "-", given, left, ""),
    )


def _rate(rng: random.Random) -> dict[str, str]:
    name = rng.choice(_NAMES)
    speed, hours, extra = rng.randint(20, 70), rng.randint(2, 6), rng.randint(5, 40)
    dist = speed * hours
    total = dist + extra
    q = (
        f"{name} drives at {speed} miles per hour for {hours} hours, then walks {extra} more miles. "
        f"How many miles does {name} travel in total?"
    )
    return _problem(q, ("Driving: ", speed, "*", hours, dist, " miles"), ("Total: ", dist, "+", extra, total, " miles"))


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
    return _problem(
        q, ("Saved: ", weekly, "*", weeks, saved, " dollars"), ("Left: ", saved, "-", spent, left, " dollars")
    )


_TEMPLATES: list[Callable[[random.Random], dict[str, str]]] = [_shopping, _sharing, _rate, _savings]


def synthetic_gsm8k(n: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` GSM8K-format problems, the same for the same seed."""
    rng = random.Random(seed)
    return [_TEMPLATES[i % len(_TEMPLATES)](rng) for i in range(n)]


def dataset_kind(value: str) -> str:
    """ "offline", "local" or "hub" for a `--env.dataset` value; a one-line ValueError when it is none."""
    if value in OFFLINE_NAMES:
        return "offline"
    path = Path(value).expanduser()
    if path.exists():
        return "local"
    looks_like_path = value.startswith((".", "/", "~")) or path.suffix in (".jsonl", ".json")
    if _HUB_NAME.fullmatch(value) and not looks_like_path:
        return "hub"
    raise ValueError(
        f"--env.dataset {value!r} is neither 'synthetic', a hub dataset name (openai/gsm8k) nor an existing "
        "JSONL file or `datasets` directory"
    )


def _checked(rows, source: str) -> list[dict[str, str]]:
    out = []
    for n, row in enumerate(rows, 1):
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("question"), str)
            or not isinstance(row.get("answer"), str)
        ):
            raise ValueError(
                f"{source} row {n}: expected openai/gsm8k's shape {{question, answer}}, got {str(row)[:80]}"
            )
        try:
            gold_answer(row["answer"])
        except ValueError:
            raise ValueError(f"{source} row {n}: the answer has no final '#### N' line") from None
        out.append({"question": row["question"], "answer": row["answer"]})
    if not out:
        raise ValueError(f"{source} has no problems")
    return out


def load_gsm8k(split: str, name: str = "openai/gsm8k") -> list[dict[str, str]]:
    """A GSM8K-format dataset from the Hugging Face hub (needs network the first time)."""
    from datasets import load_dataset

    ds = load_dataset(name, "main" if name == "openai/gsm8k" else None, split=split)
    return _checked(ds, f"{name}[{split}]")


def load_local_gsm8k(path: Path) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train, test) from a JSONL file (the same rows serve both) or a `save_to_disk` directory."""
    path = Path(path).expanduser()
    if path.is_file():
        rows = jsonl_rows(path.read_text(encoding="utf-8"), path)
        problems = _checked(rows, str(path))
        return problems, problems
    from datasets import Dataset, DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise ValueError(f"{path} is not a directory written by datasets' save_to_disk ({exc})") from None
    if isinstance(ds, Dataset):
        problems = _checked(ds, str(path))
        return problems, problems
    assert isinstance(ds, DatasetDict)
    if "train" not in ds:
        raise ValueError(f"{path} has splits {sorted(ds)}; a train split is needed")
    train = _checked(ds["train"], f"{path}[train]")
    return train, (_checked(ds["test"], f"{path}[test]") if "test" in ds else train)


_GOLD = re.compile(r"####\s*([-\d,.\s]+)\s*$")


def gold_answer(answer: str) -> str:
    """The number after `####`, without thousands separators."""
    m = _GOLD.search(answer.strip())
    if not m:
        raise ValueError(f"GSM8K answer has no '#### N' line: {answer[-80:]!r}")
    return m.group(1).replace(",", "").strip()
