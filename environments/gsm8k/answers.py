"""Reading a GSM8k answer: the marked final number, and math-verify's equality with the gold one.

Kept apart from the env (no atroposlib import) so a checker process starts quickly.
"""

from __future__ import annotations

import re

from math_verify import parse, verify

_NUMBER = r"\$?\s*-?[\d,]*\.?\d+"
# A final number the reader cannot miss: \boxed{N} (asked for), GSM8k's "#### N", "answer is N".
MARKED_ANSWER = re.compile(
    rf"\\boxed\{{\s*{_NUMBER}\s*\}}|^####\s*{_NUMBER}\s*$|answer is:?\s*{_NUMBER}", re.IGNORECASE | re.MULTILINE
)


def has_marked_answer(response: str | None) -> bool:
    """Whether the response states its final number in a recognised answer format."""
    return bool(response and MARKED_ANSWER.search(response))


def is_correct(response: str | None, gold: str) -> bool:
    if not response:
        return False
    # Without a timeout math-verify also works outside the main thread.
    predicted = parse(response, parsing_timeout=None)
    return bool(predicted) and verify(parse(gold, parsing_timeout=None), predicted, timeout_seconds=None)
