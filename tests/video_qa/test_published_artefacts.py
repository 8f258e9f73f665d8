"""The video QA loader on rows in the exact shape of the real artefacts.

- NExT-QA: the header and first two rows of dataset/nextqa/val.csv, verbatim (doc-doc/NExT-QA @
  6b92588ab4496268fa1caab9414a8b998ee063c5, MIT); its eval_mc.py keys predictions `<video>_<qid>`.
- EgoSchema (egoschema/EgoSchema @ 505c787376b5e066d0ae406d0e0d41245cebba15): questions.json is a
  list of all 5,031 questions (`q_uid, google_drive_id, question, option 0..4`, no answer);
  subset_answers.json answers 500 of them, `{q_uid: int}`. The q_uids below are real (the first
  two of subset_answers.json, answers 3 and 4; the third only in uid_to_ego4d.json); the texts are ours.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from environments.video_qa.data import load_items

NEXTQA_VAL_CSV = """\
video,frame_count,width,height,question,answer,qid,type,a0,a1,a2,a3,a4
4010069381,369,640,480,how do the two man play the instrument,0,6,CH,roll the handle,tap their feet,strum the string,hit with sticks,pat with hand
4882821564,2697,640,480,why did the boy pick up one present from the group of them and move to the sofa,2,1,CW,share with the girl,approach lady sitting there,unwrap it,playing with toy train,gesture something
"""


def _captions(folder: Path, *videos: str) -> None:
    folder.mkdir()
    for video in videos:
        (folder / f"{video}.txt").write_text("[0-4] Someone moves.\n[4-9] Someone stops.\n")


def test_nextqa_val_csv_as_published(tmp_path: Path) -> None:
    (tmp_path / "val.csv").write_text(NEXTQA_VAL_CSV)
    _captions(tmp_path / "captions", "4010069381", "4882821564")
    items = load_items(tmp_path / "val.csv")
    assert [(i["id"], i["video"], i["answer"]) for i in items] == [
        ("4010069381_6", "4010069381", 0),
        ("4882821564_1", "4882821564", 2),
    ]
    assert items[0]["question"] == "how do the two man play the instrument"
    assert items[1]["options"] == [
        "share with the girl",
        "approach lady sitting there",
        "unwrap it",
        "playing with toy train",
        "gesture something",
    ]


def _egoschema_row(q_uid: str, n: int) -> dict[str, str]:
    return {
        "q_uid": q_uid,
        "google_drive_id": f"1drive{n}",
        "question": f"What is C's main goal in video {n}?",
        **{f"option {i}": f"goal {n}.{i}" for i in range(5)},
    }


def test_egoschema_questions_json_with_the_published_subset_answers(tmp_path: Path) -> None:
    """The published questions.json holds every question and subset_answers.json answers only some:
    the answered ones are the items (the rest cannot be scored), in the questions' order."""
    uids = [
        "0074f737-11cb-497d-8d07-77c3a8127391",
        "001934bb-81bd-4cd8-a574-0472ef3f6678",  # no public answer
        "00b9a0de-c59e-49cb-a127-6081e2fb8c8e",
    ]
    (tmp_path / "questions.json").write_text(json.dumps([_egoschema_row(u, n) for n, u in enumerate(uids)]))
    answers = {"0074f737-11cb-497d-8d07-77c3a8127391": 3, "00b9a0de-c59e-49cb-a127-6081e2fb8c8e": 4}
    (tmp_path / "subset_answers.json").write_text(json.dumps(answers))
    _captions(tmp_path / "captions", uids[0], uids[2])  # an unanswered question needs no captions
    items = load_items(tmp_path / "questions.json", answers_file=tmp_path / "subset_answers.json")
    assert [(i["id"], i["answer"], i["options"][i["answer"]]) for i in items] == [
        ("0074f737-11cb-497d-8d07-77c3a8127391", 3, "goal 0.3"),
        ("00b9a0de-c59e-49cb-a127-6081e2fb8c8e", 4, "goal 2.4"),
    ]
    # Answers for none of the questions: a mismatched pair of files, said as such.
    (tmp_path / "other_answers.json").write_text(json.dumps({"ffffffff-0000-0000-0000-000000000000": 1}))
    with pytest.raises(ValueError, match="answers none of the 3 questions"):
        load_items(tmp_path / "questions.json", answers_file=tmp_path / "other_answers.json")
