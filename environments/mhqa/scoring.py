"""HotpotQA's (hotpot_evaluate_v1.py) and MuSiQue's (evaluate_v1.0.py) official metrics, written anew.

Answers are normalised as both official scripts do: lowercase, punctuation (string.punctuation)
removed, the articles a/an/the removed as words, whitespace collapsed. Token F1 is the bag-of-
tokens overlap. HotpotQA's rule (`hotpot_rules=True`): when either normalised side is `yes`, `no`
or `noanswer` and they differ, F1 is 0 (a yes/no question is right or wrong, never half right).
MuSiQue's (SQuAD's compute_f1, `hotpot_rules=False`): no such rule, and F1 is 1 when both sides
normalise to nothing. With several gold answers (MuSiQue's `answer` + `answer_aliases`), the best
score over them counts, as MuSiQue's evaluation does.

Supporting facts are sets of (title, sentence index); their EM/F1 are set precision/recall, and
the joint metrics multiply answer and supporting-fact precision and recall (EM: both exact).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["normalize_answer", "answer_scores", "best_answer_scores", "SetScores", "sp_scores", "joint_scores"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_CLOSED = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


@dataclass(frozen=True)
class SetScores:
    em: float
    f1: float
    precision: float
    recall: float


def answer_scores(prediction: str, gold: str, hotpot_rules: bool = True) -> SetScores:
    """EM, F1, precision and recall of one prediction against one gold answer (rules: module docstring)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    em = float(pred == ref)
    if hotpot_rules and (pred in _CLOSED or ref in _CLOSED) and pred != ref:
        return SetScores(em, 0.0, 0.0, 0.0)
    if not hotpot_rules and not (pred and ref):
        return SetScores(em, em, em, em)
    common = Counter(pred.split()) & Counter(ref.split())
    same = sum(common.values())
    if same == 0:
        return SetScores(em, 0.0, 0.0, 0.0)
    precision, recall = same / len(pred.split()), same / len(ref.split())
    return SetScores(em, 2 * precision * recall / (precision + recall), precision, recall)


def best_answer_scores(prediction: str, golds: Iterable[str], hotpot_rules: bool = True) -> SetScores:
    """The best scores over the gold answer and its aliases (by F1, then EM)."""
    scored = [answer_scores(prediction, g, hotpot_rules) for g in golds]
    if not scored:
        raise ValueError("an item needs at least one gold answer")
    return max(scored, key=lambda s: (s.f1, s.em))


def sp_scores(predicted: Iterable[tuple[str, int]], gold: Iterable[tuple[str, int]]) -> SetScores:
    pred, ref = set(predicted), set(gold)
    tp, fp, fn = len(pred & ref), len(pred - ref), len(ref - pred)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return SetScores(float(fp + fn == 0), f1, precision, recall)


def joint_scores(answer: SetScores, sp: SetScores) -> SetScores:
    precision, recall = answer.precision * sp.precision, answer.recall * sp.recall
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return SetScores(answer.em * sp.em, f1, precision, recall)
