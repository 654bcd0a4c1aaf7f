"""Question answering end to end with an LM: the HyperProve program, and any system's top
passages + the same reader as its baseline; EM, F1, Recall@k, LM calls and seconds per question.

One question never stops a batch: an exception is recorded in that question's row (its answer
counts as wrong) and the run goes on.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import dspy
import numpy as np

from experiments.data import Question
from experiments.metrics import exact_match, f1_score, mean_percent, recall_at_k
from modules.errors import HyperProveError
from modules.facts import Passage
from modules.steps import AnswerGenerator, evidence_line


class PassageReader(dspy.Module):
    """Baseline reader: a system's top-k passages for the question, read by the program's final reader."""

    def __init__(self, search: Callable[[str], list[int]], passages: Sequence[Passage], k: int = 5):
        super().__init__()
        self.search, self.passages, self.k = search, passages, k
        self.generate = AnswerGenerator()

    def forward(self, question: str) -> dspy.Prediction:
        from pipeline.program import LM_FAILURES

        started = time.perf_counter()
        ranked = self.search(question)
        retrieval_seconds = time.perf_counter() - started
        evidence = [evidence_line(self.passages[p].title, self.passages[p].text) for p in ranked[: self.k]]
        fallbacks = []
        try:
            answer = self.generate(question=question, evidence=evidence).answer
        except LM_FAILURES as error:
            answer = ""
            fallbacks.append(f"final answer: {error}")
        return dspy.Prediction(answer=answer, passages=ranked, chain=[], fallbacks=fallbacks, retrieval_seconds=retrieval_seconds)


def evaluate_program(
    questions: Sequence[Question],
    program: Callable[[str], dspy.Prediction],
    count_calls: Callable[[], int],
    ks: Sequence[int] = (2, 5),
    progress: str | None = None,
) -> tuple[dict, list[dict]]:
    """Run the program on every question; mean EM/F1 (0-100), Recall@k, calls and seconds each."""
    from tqdm import tqdm

    if not questions:
        raise HyperProveError("no questions to evaluate")
    rows = []
    for question in tqdm(questions, desc=progress, unit="question", disable=progress is None):
        calls_before, started = count_calls(), time.perf_counter()
        row = {"id": question.id, "question": question.question, "gold_answer": question.answer}
        try:
            prediction = program(question.question)
            row.update(answer=prediction.answer, passages=list(prediction.passages)[: max(ks)],
                       chain=prediction.chain, fallbacks=prediction.fallbacks,
                       retrieval_seconds=round(float(prediction.get("retrieval_seconds", 0.0)), 6))
        except Exception as error:  # noqa: BLE001 - one question must not stop the batch
            row.update(answer="", passages=[], chain=[], fallbacks=[], error=f"{type(error).__name__}: {error}")
        golds = [question.answer, *question.answer_aliases]
        row["em"] = float(exact_match(row["answer"], golds))
        row["f1"] = float(f1_score(row["answer"], golds))
        if question.gold_passages:
            row.update({f"recall@{k}": recall_at_k(row["passages"], question.gold_passages, k) for k in ks})
        row["lm_calls"] = count_calls() - calls_before
        row["seconds"] = round(time.perf_counter() - started, 3)
        rows.append(row)
    summary = {
        "n": len(rows),
        "em": mean_percent(rows, "em"),
        "f1": mean_percent(rows, "f1"),
    }
    with_gold = [r for r in rows if f"recall@{ks[0]}" in r]
    if with_gold:
        summary.update({f"recall@{k}": mean_percent(with_gold, f"recall@{k}") for k in ks})
    summary["lm_calls_per_question"] = round(float(np.mean([r["lm_calls"] for r in rows])), 2)
    summary["seconds_per_question"] = round(float(np.mean([r["seconds"] for r in rows])), 2)
    timed = [r["retrieval_seconds"] for r in rows if "retrieval_seconds" in r]
    summary["retrieval_ms_per_question"] = round(1000 * float(np.mean(timed)), 2) if timed else None
    summary["errors"] = sum("error" in r for r in rows)
    summary["questions_with_fallbacks"] = sum(bool(r["fallbacks"]) for r in rows)
    return summary, rows
