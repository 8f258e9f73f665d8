"""HotpotQA and MuSiQue rows, in their published shapes, as one kind of item.

Accepted rows (detected per row):
- HotpotQA JSON (hotpot_dev_distractor_v1.json, hotpot_dev_fullwiki_v1.json): `_id, question, answer,
  type, level, supporting_facts [[title, sent_id]], context [[title, [sentences]]]`;
- HotpotQA on the hub (`hotpot_qa`, parquet): `id, ..., supporting_facts {title: [..], sent_id: [..]},
  context {title: [..], sentences: [[..]]}`;
- MuSiQue (musique_ans_v1.0_dev.jsonl): `id, paragraphs [{idx, title, paragraph_text, is_supporting}],
  question, question_decomposition, answer, answer_aliases, answerable`. A paragraph is one
  "sentence" (index 0): MuSiQue marks supporting paragraphs, not sentences.

Every item becomes `{id, question, answers, paragraphs: [{title, sentences}], supporting_facts:
[[title, sent_id]], source}`; `answers[0]` is the gold answer, the rest its aliases.

Sources: a `.jsonl`, `.json` (a JSON array, as HotpotQA publishes it) or `.parquet` file, a
`datasets` `save_to_disk` directory, or a hub name read through `datasets` (network).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from environments.jsonl import jsonl_rows
from environments.saved_datasets import saved_rows

__all__ = ["OFFLINE_PATH", "load_items", "to_item"]

OFFLINE_PATH = Path(__file__).resolve().parent.parent / "data" / "mhqa" / "offline.jsonl"


def to_item(row: Any, where: str) -> dict[str, Any]:
    """One published row as an item; a ValueError naming `where` when the row has neither shape."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object (a HotpotQA or MuSiQue row), got {type(row).__name__}")
    if isinstance(row.get("paragraphs"), list):
        return _musique(row, where)
    if "context" in row:
        return _hotpot(row, where)
    raise ValueError(
        f"{where}: neither a HotpotQA row (question, answer, context, supporting_facts) nor a MuSiQue row "
        f"(question, answer, paragraphs); keys: {sorted(row)[:12]}"
    )


def _answer(row: dict[str, Any], where: str) -> str:
    answer = row.get("answer")
    if not isinstance(answer, str) or not isinstance(row.get("question"), str):
        raise ValueError(f"{where}: the row has no question/answer strings (a test split has no answers)")
    return answer


def _hotpot(row: dict[str, Any], where: str) -> dict[str, Any]:
    answer = _answer(row, where)
    if "_id" not in row and "id" not in row:
        raise ValueError(f"{where}: a HotpotQA row needs its `_id` (or the hub's `id`)")
    context, facts = row["context"], row.get("supporting_facts") or []
    if isinstance(context, dict):  # the hub's columnar form
        pairs = list(zip(context["title"], context["sentences"]))
    else:
        pairs = [(title, sentences) for title, sentences in context]
    if isinstance(facts, dict):
        facts = list(zip(facts["title"], facts["sent_id"]))
    return {
        "id": str(row["_id"] if "_id" in row else row["id"]),
        "question": row["question"],
        "answers": [answer],
        "paragraphs": [{"title": str(t), "sentences": [str(s) for s in sents]} for t, sents in pairs],
        "supporting_facts": [[str(t), int(i)] for t, i in facts],
        "source": "hotpotqa",
    }


def _musique(row: dict[str, Any], where: str) -> dict[str, Any]:
    if row.get("answerable") is False:
        raise ValueError(f"{where}: an unanswerable MuSiQue row; use the answerable (musique_ans) files")
    answer = _answer(row, where)
    paragraphs = sorted(row["paragraphs"], key=lambda p: p.get("idx", 0))
    return {
        "id": str(row["id"]),
        "question": row["question"],
        "answers": [answer, *[a for a in row.get("answer_aliases") or [] if a != answer]],
        "paragraphs": [{"title": p["title"], "sentences": [p["paragraph_text"]]} for p in paragraphs],
        "supporting_facts": [[p["title"], 0] for p in paragraphs if p.get("is_supporting")],
        "source": "musique",
    }


def _read_rows(source: str, split: str, hub_config: str | None) -> list[Any]:
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq  # noqa: PLC0415 - only parquet sources need it

            return pq.read_table(path).to_pylist()
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            rows = json.loads(text)
            if not isinstance(rows, list):
                raise ValueError(f"{path} is not a JSON array of rows (HotpotQA's own files are)")
            return rows
        return jsonl_rows(text, path)
    if path.is_dir():
        return saved_rows(path, split)
    if source.startswith((".", "/", "~")) or path.suffix in (".json", ".jsonl", ".parquet"):
        raise ValueError(f"--env.dataset {source!r}: no such file or directory")
    from datasets import load_dataset  # noqa: PLC0415 - heavy import

    return list(load_dataset(source, hub_config, split=split))


def load_items(source: str, split: str = "validation", hub_config: str | None = None) -> list[dict[str, Any]]:
    """Items of a file, a save_to_disk directory or a hub dataset; a ValueError says what is wrong."""
    rows = _read_rows(source, split, hub_config)
    items = [to_item(row, f"{source} row {n}") for n, row in enumerate(rows, 1)]
    if not items:
        raise ValueError(f"{source} has no rows")
    return items
