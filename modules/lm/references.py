"""Sub-question references: "#k" in a sub-question stands for the answer of step k (MuSiQue's
notation, METHOD.md step 4), filled in before the hop runs (step 5)."""

from __future__ import annotations

import re
from typing import Sequence

REFERENCE = re.compile(r"#(\d+)")


def fill_references(sub_question: str, answers: Sequence[str]) -> str:
    """Replace "#k" with the answer of step k (1-based); unknown references stay as written."""

    def answer(match: re.Match) -> str:
        k = int(match.group(1))
        return answers[k - 1] if 1 <= k <= len(answers) else match.group(0)

    return REFERENCE.sub(answer, sub_question)


def references(text: str) -> list[int]:
    return [int(k) for k in REFERENCE.findall(text)]
