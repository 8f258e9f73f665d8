"""HotpotQA's official metrics (hotpot_evaluate_v1.py behaviour) on hand-computed fixtures."""

from __future__ import annotations

import pytest

from environments.mhqa.scoring import answer_scores, best_answer_scores, joint_scores, normalize_answer, sp_scores


@pytest.mark.parametrize(
    ("pred", "gold", "em", "f1"),
    [
        ("Kettering Vale", "Kettering Vale", 1.0, 1.0),  # exact
        ("The KETTERING Vale.", "Kettering Vale", 1.0, 1.0),  # case, article, punctuation
        ("an Apple", "apple", 1.0, 1.0),
        ("Kettering-Vale", "Kettering Vale", 0.0, 0.0),  # punctuation is removed, not spaced: one token
        ("Kettering Vale town", "Kettering Vale", 0.0, 0.8),  # p 2/3, r 1
        ("vale vale", "vale", 0.0, 2 / 3),  # tokens counted with multiplicity: p 1/2, r 1
        ("no", "yes", 0.0, 0.0),  # yes/no mismatch
        ("yes it is", "yes", 0.0, 0.0),  # gold is yes: any other prediction is wrong, overlap or not
        ("Yes.", "yes", 1.0, 1.0),
        ("noanswer", "no answer", 0.0, 0.0),  # prediction noanswer, gold differs
        ("Selmar", "Kettering Vale", 0.0, 0.0),
        ("", "Kettering Vale", 0.0, 0.0),
    ],
)
def test_answer_em_and_f1(pred: str, gold: str, em: float, f1: float) -> None:
    s = answer_scores(pred, gold)
    assert s.em == em and s.f1 == pytest.approx(f1)


def test_normalisation_is_the_official_one() -> None:
    assert normalize_answer("  The  Cat's   A-team, an   Answer! ") == "cats ateam answer"
    assert normalize_answer("theatre another") == "theatre another"  # articles only as whole words


def test_aliases_take_the_best_gold() -> None:
    golds = ["cello", "violoncello"]
    assert best_answer_scores("Violoncello", golds).em == 1.0
    assert best_answer_scores("the cello", golds).em == 1.0
    partial = best_answer_scores("a big cello", golds)
    assert partial.em == 0.0 and partial.f1 == pytest.approx(2 / 3)  # "big cello" vs "cello"
    with pytest.raises(ValueError):
        best_answer_scores("x", [])


def test_supporting_facts_and_joint() -> None:
    sp = sp_scores([("A", 1), ("B", 1), ("C", 0)], [("A", 1), ("B", 2)])
    assert (sp.em, sp.precision, sp.recall) == (0.0, pytest.approx(1 / 3), 0.5)
    assert sp.f1 == pytest.approx(0.4)
    exact = sp_scores([("B", 2), ("A", 1), ("A", 1)], [("A", 1), ("B", 2)])
    assert (exact.em, exact.f1) == (1.0, 1.0)
    assert sp_scores([], [("A", 1)]).f1 == 0.0
    joint = joint_scores(answer_scores("Kettering Vale town", "Kettering Vale"), sp)
    # precision 2/3 * 1/3 = 2/9, recall 1 * 1/2: F1 = 2 (2/9)(1/2) / (2/9 + 1/2) = 4/13
    assert joint.em == 0.0 and joint.f1 == pytest.approx(4 / 13)
    assert joint_scores(answer_scores("x", "x"), exact).em == 1.0
