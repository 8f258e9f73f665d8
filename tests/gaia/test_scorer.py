"""question_scorer on GAIA's normalisation cases: numbers (units, commas, $ and %), lists, strings."""

from __future__ import annotations

import pytest

from environments.gaia.env import efficiency, extract_final_answer, question_scorer


@pytest.mark.parametrize(
    ("answer", "truth", "expected"),
    [
        # numbers: compared as floats after removing $, % and ','
        ("1216", "1216", True),
        ("1,216", "1216", True),
        ("$1,216.00", "1216", True),
        ("17.0", "17", True),
        (" 17 ", "17", True),
        ("45%", "45", True),
        ("0.5", "0.50", True),
        ("1e3", "1000", True),
        ("17 km", "17", False),  # units other than $ and % are not stripped: the prompt forbids them
        ("seventeen", "17", False),
        ("18", "17", False),
        ("", "0", False),
        # lists: split on ',' or ';', same length, numbers as numbers, strings lower-cased without spaces
        ("Aurel, Brin, Tessaly", "Aurel, Brin, Tessaly", True),
        ("aurel,brin,tessaly", "Aurel, Brin, Tessaly", True),
        ("Aurel; Brin; Tessaly", "Aurel, Brin, Tessaly", True),
        ("Brin, Aurel, Tessaly", "Aurel, Brin, Tessaly", False),  # order matters
        ("Aurel, Brin", "Aurel, Brin, Tessaly", False),
        ("3, $4.00, 5%", "3, 4, 5", True),
        ("3, 4, six", "3, 4, 6", False),
        ("a.b, c", "a.b, c", True),
        ("ab, c", "a.b, c", False),  # list elements keep their punctuation
        ("New York, Los Angeles", "new york,los angeles", True),
        # strings: lower-cased, whitespace and punctuation removed
        ("Tromvik", "Tromvik", True),
        ("tromvik.", "Tromvik", True),
        ("  TROM vik ", "Tromvik", True),
        ("Saint-Petersburg", "Saint Petersburg", True),
        ("St. Petersburg", "Saint Petersburg", False),
        ("Marta  Quist!", "Marta Quist", True),
        ("Tromvik harbour", "Tromvik", False),
    ],
)
def test_question_scorer(answer: str, truth: str, expected: bool) -> None:
    assert question_scorer(answer, truth) is expected


def test_none_answer_is_wrong_but_not_a_crash() -> None:
    assert question_scorer(None, "17") is False  # type: ignore[arg-type]  # a model may answer nothing
    assert question_scorer(None, "None") is True  # type: ignore[arg-type]  # GAIA's scorer compares str(None)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Reasoning...\nFINAL ANSWER: 1887", "1887"),
        ("final answer:   Tromvik  \nthanks", "Tromvik"),
        ("FINAL ANSWER: 1\nwait, no.\nFINAL ANSWER: **2**", "2"),
        ("The answer is 1887.", None),
        (None, None),
    ],
)
def test_extract_final_answer(response: str | None, expected: str | None) -> None:
    assert extract_final_answer(response) == expected


def test_efficiency_term() -> None:
    assert efficiency(0, 4, 20) == efficiency(4, 4, 20) == 1.0
    assert efficiency(12, 4, 20) == pytest.approx(0.5)
    assert efficiency(20, 4, 20) == efficiency(99, 4, 20) == 0.0
