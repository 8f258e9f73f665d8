"""MuSiQue rows are scored as MuSiQue's official evaluate_v1.0.py scores them.

Checked against StonyBrookNLP/musique @ 922ac98f19a201998dbdae6d7f2887a5258dbdeb: evaluate_v1.0.py
takes `[answer] + answer_aliases` as the gold answers and metrics/answer.py keeps, over them, the
best EM and the best F1 (SQuAD's compute_exact / compute_f1). That F1 has no yes/no/noanswer rule
(HotpotQA's script has one) and gives 1 when both sides normalise to nothing. The row below is in
the published format (README / raw_data_to_official_format.py); its text is ours.
"""

from __future__ import annotations

import pytest

from environments.mhqa.data import to_item
from environments.mhqa.env import score_response
from environments.mhqa.scoring import SetScores, answer_scores

MUSIQUE_ROW = {
    "id": "2hop__804754_52230",
    "paragraphs": [
        {
            "idx": 0,
            "title": "Tragic Kingdom",
            "paragraph_text": "Tragic Kingdom is an album by No Doubt.",
            "is_supporting": True,
        },
        {"idx": 1, "title": "Selmar", "paragraph_text": "Selmar is a port city.", "is_supporting": False},
        {
            "idx": 2,
            "title": "No Doubt",
            "paragraph_text": "No Doubt is a band formed in Anaheim.",
            "is_supporting": True,
        },
    ],
    "question": "Which band released Tragic Kingdom?",
    "question_decomposition": [
        {"id": 804754, "question": "Tragic Kingdom >> performer", "answer": "No Doubt", "paragraph_support_idx": 0},
        {"id": 52230, "question": "#1 >> formed in", "answer": "Anaheim", "paragraph_support_idx": 2},
    ],
    "answer": "No Doubt",
    "answer_aliases": ["No Doubt (band)"],
    "answerable": True,
}


@pytest.mark.parametrize(
    ("prediction", "em", "f1"),
    [
        ("No Doubt", 1.0, 1.0),
        ("no doubt.", 1.0, 1.0),  # case and punctuation
        ("no doubt band", 1.0, 1.0),  # the alias "No Doubt (band)" once normalised
        ("band, No Doubt", 0.0, 1.0),  # the alias's tokens in another order: F1 1.0, no exact match
        ("no", 0.0, 2 / 3),  # SQuAD F1: one of two gold tokens; HotpotQA's yes/no rule does not apply
        ("Doubt", 0.0, 2 / 3),
        ("Anaheim", 0.0, 0.0),
    ],
)
def test_answers_scored_as_the_official_musique_script(prediction: str, em: float, f1: float) -> None:
    item = to_item(MUSIQUE_ROW, "musique row")
    assert item["answers"] == ["No Doubt", "No Doubt (band)"]
    assert item["supporting_facts"] == [["Tragic Kingdom", 0], ["No Doubt", 0]]
    scores = score_response(item, f"FINAL ANSWER: {prediction}")["answer"]
    assert (scores.em, scores.f1) == (em, pytest.approx(f1))


def test_hotpotqa_rows_keep_the_yes_no_rule() -> None:
    hotpot = to_item(
        {
            "_id": "h1",
            "question": "Is No Doubt a band?",
            "answer": "yes",
            "type": "comparison",
            "level": "easy",
            "supporting_facts": [["No Doubt", 0]],
            "context": [["No Doubt", ["No Doubt is a band."]]],
        },
        "hotpot row",
    )
    assert score_response(hotpot, "FINAL ANSWER: yes it is")["answer"].f1 == 0.0


def test_empty_answers_as_squads_f1() -> None:
    """compute_f1: when either side has no tokens, F1 is whether both have none."""
    assert answer_scores("The.", "a", hotpot_rules=False) == SetScores(1.0, 1.0, 1.0, 1.0)
    assert answer_scores("", "No Doubt", hotpot_rules=False).f1 == 0.0
    assert answer_scores("The.", "a").f1 == 0.0  # HotpotQA's f1_score: no common token, 0
