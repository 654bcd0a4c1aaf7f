"""Question answering end to end with an LM: the HyperProve program, and any system's top
passages + the same reader as its baseline; EM, F1, Recall@k, LM calls and seconds per question.

One question never stops a batch: an exception is recorded in that question's row (its answer
counts as wrong) and the run goes on; an LM that cannot answer at all (`LM_UNAVAILABLE`) stops it.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Callable, Sequence

import dspy
import numpy as np

from experiments.data import Question
from experiments.metrics import exact_match, f1_score, mean_percent, recall_at_k
from modules.errors import HyperProveError
from modules.facts import Passage
from modules.lm.predictors import AnswerGenerator, evidence_line
from pipeline.lm.session import LM_UNAVAILABLE
from pipeline.runtime import no_trace
from pipeline.scope import scoped
from pipeline.serve.pages import reached_passages


class PassageReader(dspy.Module):
    """Baseline reader: a system's top-k passages for the question, read by the program's final
    reader (`encode` chooses its demonstrations where a compiled program gave it a pool)."""

    def __init__(self, search: Callable[[str], list[int]], passages: Sequence[Passage], k: int = 5, choose: bool = False,
                 encode: Callable[[str], np.ndarray] | None = None):
        super().__init__()
        self.search, self.passages, self.k, self.choose, self.encode = search, passages, k, choose, encode
        self.generate = AnswerGenerator()

    def forward(self, question: str) -> dspy.Prediction:
        from pipeline.program import LM_FAILURES

        started = time.perf_counter()
        ranked = self.search(question)
        retrieval_seconds = time.perf_counter() - started
        evidence = [evidence_line(self.passages[p].title, self.passages[p].text) for p in ranked[: self.k]]
        fallbacks, before_choice = [], None
        try:
            reading = self.generate(question=question, evidence=evidence, choose=self.choose, encode=self.encode)
            answer, before_choice = reading.answer, reading.replaced
            if reading.replaced is not None:
                fallbacks.append(reading.note)
        except LM_FAILURES as error:
            answer = ""
            fallbacks.append(f"final answer: {error}")
        return dspy.Prediction(answer=answer, answer_before_choice=before_choice, passages=ranked, chain=[], fallbacks=fallbacks,
                               retrieval_seconds=retrieval_seconds)


def lm_cost_summary(rows: Sequence[dict]) -> dict:
    """Tokens per question, and per LM module what it cost a question (means); `lm_cache_hits`
    counts the calls DSPy's cache answered (their seconds are not what the LM costs)."""
    modules: dict[str, dict] = {}
    for row in rows:
        for module, cost in row.get("lm_steps", {}).items():
            total = modules.setdefault(module, dict.fromkeys(cost, 0))
            for key, value in cost.items():
                total[key] += value
    per_question = {module: {key: round(value / len(rows), 2) for key, value in total.items()} for module, total in modules.items()}

    def total(key: str) -> float:
        return round(sum(cost[key] for cost in per_question.values()), 1)

    return {"prompt_tokens_per_question": total("prompt_tokens"), "cached_prompt_tokens_per_question": total("cached_prompt_tokens"),
            "completion_tokens_per_question": total("completion_tokens"), "lm_cache_hits": sum(m["cache_hits"] for m in modules.values()),
            "lm_steps": per_question}


def trace_tags(question: Question, row: dict) -> dict:
    """What a question's trace is tagged with, so that the MLflow UI can filter the failures."""
    return {"question_id": question.id, "gold_answer": question.answer, "em": row["em"], "f1": round(row["f1"], 4),
            "gold_passages": list(question.gold_passages), "gold_reached": set(question.gold_passages) <= reached_passages(row)}


def evaluate_program(
    questions: Sequence[Question],
    program: Callable[[str], dspy.Prediction],
    ks: Sequence[int] = (2, 5),
    progress: str | None = None,
    trace: Callable | None = None,
    system: str = "hyperprove",
) -> tuple[dict, list[dict]]:
    """Run the program on every question (`answer_row`), then `summarize` the rows."""
    from tqdm import tqdm

    if not questions:
        raise HyperProveError("no questions to evaluate")
    rows = []
    with tqdm(questions, desc=progress, unit="question", disable=progress is None) as bar:  # closed (its line ended) before any error
        for question in bar:
            rows.append(answer_row(question, program, ks, trace, system))
    return summarize(rows, ks), rows


def answer_row(question: Question, program: Callable[[str], dspy.Prediction], ks: Sequence[int] = (2, 5),
               trace: Callable | None = None, system: str = "hyperprove") -> dict:
    """One question's row: answer, ranked passages, chain, EM/F1, Recall@k, seconds, and what its
    LM modules cost (the question's scope tallies them: `pipeline.scope`). `trace(question, system)`
    (`Runtime.question_trace`) is the context the question runs in: its MLflow trace, tagged with
    the question's gold and scores."""
    started = time.perf_counter()
    row = {"id": question.id, "question": question.question, "gold_answer": question.answer}
    with (trace or no_trace)(question.question, system) as finish, scoped(system=system, question=question.id, costs={}) as scope:
        try:
            prediction = program(question.question)
            row.update(answer=prediction.answer, passages=list(prediction.passages)[: max(ks)],
                       chain=prediction.chain, fallbacks=prediction.fallbacks,
                       retrieval_seconds=round(float(prediction.get("retrieval_seconds", 0.0)), 6))
            if prediction.get("answer_before_choice") is not None:
                row["answer_before_choice"] = prediction.answer_before_choice
            if prediction.get("by_rule"):
                row["by_rule"] = prediction.by_rule
            if prediction.get("planned_by_rule"):
                row["planned_by_rule"] = True
            if prediction.get("documentation"):
                row["documentation_demos"] = True
        except LM_UNAVAILABLE:
            raise
        except Exception as error:  # noqa: BLE001 - one question must not stop the batch
            row.update(answer="", passages=[], chain=[], fallbacks=[], error=f"{type(error).__name__}: {error}")
        golds = [question.answer, *question.answer_aliases]
        row["em"] = float(exact_match(row["answer"], golds))
        row["f1"] = float(f1_score(row["answer"], golds))
        if question.gold_passages:
            row.update({f"recall@{k}": recall_at_k(row["passages"], question.gold_passages, k) for k in ks})
        finish(row["answer"], row["fallbacks"], trace_tags(question, row))
    row["seconds"] = round(time.perf_counter() - started, 3)
    spent = scope.spent()
    row["lm_calls"] = sum(cost.calls for cost in spent.values())
    row["lm_steps"] = {module: {**asdict(cost), "seconds": round(cost.seconds, 3)} for module, cost in spent.items()}
    return row


def summarize(rows: Sequence[dict], ks: Sequence[int] = (2, 5)) -> dict:
    """The table row of a system: mean EM/F1 (0-100), Recall@k, LM calls, tokens and seconds per question."""
    summary = {
        "n": len(rows),
        "em": mean_percent(rows, "em"),
        "f1": mean_percent(rows, "f1"),
    }
    with_gold = [r for r in rows if f"recall@{ks[0]}" in r]
    if with_gold:
        summary.update({f"recall@{k}": mean_percent(with_gold, f"recall@{k}") for k in ks})
    summary["lm_calls_per_question"] = round(float(np.mean([r["lm_calls"] for r in rows])), 2)
    summary.update(lm_cost_summary(rows))
    summary["seconds_per_question"] = round(float(np.mean([r["seconds"] for r in rows])), 2)
    timed = [r["retrieval_seconds"] for r in rows if "retrieval_seconds" in r]
    summary["retrieval_ms_per_question"] = round(1000 * float(np.mean(timed)), 2) if timed else None
    summary["errors"] = sum("error" in r for r in rows)
    summary["questions_with_fallbacks"] = sum(bool(r["fallbacks"]) for r in rows)
    if any("by_rule" in r for r in rows):
        summary["answered_by_rule"] = sum("by_rule" in r for r in rows)
    if any("planned_by_rule" in r for r in rows):
        summary["planned_by_rule"] = sum("planned_by_rule" in r for r in rows)
    if any("documentation_demos" in r for r in rows):
        summary["documentation_demos"] = sum("documentation_demos" in r for r in rows)
    return summary
