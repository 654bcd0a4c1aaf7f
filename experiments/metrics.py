"""Metrics as in HippoRAG 2 and the paper: Recall@k over passages, EM and token F1 (SQuAD)."""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles, collapse whitespace."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, answers: Iterable[str]) -> float:
    predicted = normalize_answer(prediction)
    return max((float(predicted == normalize_answer(a)) for a in answers), default=0.0)


def _f1(prediction: str, answer: str) -> float:
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(answer).split()
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: Iterable[str]) -> float:
    """Token F1, best over the answer and its aliases."""
    return max((_f1(prediction, a) for a in answers), default=0.0)


def mean_percent(rows: Sequence[dict], key: str) -> float:
    """The mean of a 0-1 score over rows, as a percentage rounded to 2 places (how tables report)."""
    return round(100 * sum(row[key] for row in rows) / len(rows), 2)


def recall_at_k(ranked_passages: Sequence[int], gold_passages: Sequence[int], k: int) -> float:
    """|gold among the top-k| / |gold|; a question without gold passages is not scored (raises)."""
    gold = set(gold_passages)
    if not gold:
        raise ValueError("recall_at_k needs at least one gold passage")
    return len(gold & set(ranked_passages[:k])) / len(gold)


SCORES = ("em", "f1", "recall@2", "recall@5")  # the per-question scores a row may carry


def question_type(raw: str) -> str:
    """The type a question is reported under: MuSiQue's "3hop1" and "3hop2" (two shapes of a
    3-hop chain) are both "3hop"; 2Wiki's and HotpotQA's types stay as they are."""
    return re.sub(r"^(\d+hop)\d+$", r"\1", raw) if raw else "untyped"


def per_type(rows: Sequence[dict], types: dict[str, str]) -> dict[str, dict]:
    """Per question type (`types`: question id -> type), the number of rows and the mean of each
    score the rows carry; {} when the questions have no types."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(question_type(types.get(row["id"], "")), []).append(row)
    if set(groups) <= {"untyped"}:
        return {}
    return {kind: {"n": len(group), **{score: mean_percent([r for r in group if score in r], score)
                                        for score in SCORES if any(score in r for r in group)}}
            for kind, group in sorted(groups.items())}
