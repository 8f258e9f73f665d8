"""Multiple-choice video QA rows (EgoSchema, NExT-QA and plain shapes) with their caption files.

Accepted rows (detected per row), five options each, the answer an index 0-4 (int or digit string)
or a letter A-E:
- EgoSchema (questions.json): `q_uid, google_drive_id, question, option 0 .. option 4` and `answer`
  (or the answers in subset_answers.json `{q_uid: index}`, passed as `answers_file`: then only the
  questions it answers are items, as it answers 500 of the 5,031); video `q_uid`;
- NExT-QA (val.csv rows): `video, qid, type, question, a0 .. a4, answer`; video `video`;
- plain: `id, video_id, question, options [5], answer`.

Captions are `[start-end] text` lines in seconds: a row's `captions` text, or the file
`<captions_dir>/<video>.txt` (default captions_dir: `captions/` beside the rows file).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from environments.jsonl import jsonl_rows
from tools.documents import Caption, parse_captions

__all__ = ["OFFLINE_PATH", "LETTERS", "captions_of", "load_items", "to_item"]

OFFLINE_PATH = Path(__file__).resolve().parent.parent / "data" / "video_qa" / "questions.jsonl"
LETTERS = "ABCDE"


def _options(row: dict[str, Any]) -> tuple[list[str], str, str] | None:
    """(options, id, video) of a row, or None when it has no known option columns."""
    if all(f"option {i}" in row for i in range(5)):
        return [row[f"option {i}"] for i in range(5)], str(row["q_uid"]), str(row["q_uid"])
    if all(f"a{i}" in row for i in range(5)):
        return [row[f"a{i}"] for i in range(5)], f"{row['video']}_{row['qid']}", str(row["video"])
    if isinstance(row.get("options"), list):
        return list(row["options"]), str(row["id"]), str(row.get("video_id", row["id"]))
    return None


def _answer_index(answer: Any, where: str) -> int:
    if isinstance(answer, str) and answer.strip().upper() in LETTERS and answer.strip():
        return LETTERS.index(answer.strip().upper())
    try:
        index = int(answer)
    except (TypeError, ValueError):
        index = -1
    if not 0 <= index < 5:
        raise ValueError(f"{where}: answer {answer!r} is not an option index 0-4 or a letter A-E")
    return index


def to_item(
    row: dict[str, Any], where: str, captions_dir: Path, answers: dict[str, Any] | None = None
) -> dict[str, Any]:
    found = _options(row)
    if found is None or not isinstance(row.get("question"), str):
        raise ValueError(
            f"{where}: expected an EgoSchema (option 0..4), NExT-QA (a0..a4) or plain (options) row with a "
            f"question; keys: {sorted(row)[:12]}"
        )
    options, item_id, video = found
    if len(options) != 5:
        raise ValueError(f"{where}: {len(options)} options; multiple choice here has five")
    answer = row.get("answer", (answers or {}).get(item_id))
    if answer is None:
        raise ValueError(f"{where}: no answer for {item_id!r} (EgoSchema: pass subset_answers.json as answers_file)")
    if isinstance(row.get("captions"), str):
        captions = parse_captions(row["captions"], f"{where} captions")
    else:
        path = captions_dir / f"{video}.txt"
        if not path.is_file():
            raise ValueError(f"{where}: no captions in the row and no caption file {path}")
        captions = parse_captions(path.read_text(encoding="utf-8"), str(path))
    if not captions:
        raise ValueError(f"{where}: the captions of video {video!r} are empty")
    return {
        "id": item_id,
        "video": video,
        "question": row["question"],
        "options": [str(o) for o in options],
        "answer": _answer_index(answer, where),
        "captions": [list(c) for c in captions],
    }


def _rows(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".csv":
        return list(csv.DictReader(text.splitlines()))
    if path.suffix == ".json":
        rows = json.loads(text)
        return rows if isinstance(rows, list) else [rows]
    return jsonl_rows(text, path)


def load_items(path: Path, captions_dir: Path | None = None, answers_file: Path | None = None) -> list[dict[str, Any]]:
    """Items of a .jsonl/.json/.csv rows file; a ValueError says which row is wrong and how."""
    if not path.is_file():
        raise ValueError(f"{path}: no such rows file (.jsonl, .json or .csv)")
    answers = json.loads(answers_file.read_text(encoding="utf-8")) if answers_file else None
    folder = captions_dir or path.parent / "captions"
    rows = list(enumerate(_rows(path), 1))
    if answers is not None:
        # EgoSchema's questions.json holds all 5,031 questions, subset_answers.json answers 500: the
        # rest cannot be scored, so only answered rows become items (and need captions).
        answered = [(n, row) for n, row in rows if not isinstance(row, dict) or _answered(row, answers)]
        if rows and not answered:
            raise ValueError(f"{answers_file} answers none of the {len(rows)} questions in {path}: a mismatched pair?")
        rows = answered
    items = [to_item(row, f"{path} row {n}", folder, answers) for n, row in rows]
    if not items:
        raise ValueError(f"{path} has no rows")
    return items


def _answered(row: dict[str, Any], answers: dict[str, Any]) -> bool:
    found = _options(row)
    return row.get("answer") is not None or (found is not None and found[1] in answers)


def captions_of(item: dict[str, Any]) -> list[Caption]:
    return [Caption(float(s), float(e), str(t)) for s, e, t in item["captions"]]
