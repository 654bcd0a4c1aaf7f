"""Retrieval with gold decompositions (no LM): the pieces the harness composes.

- `gold_sub_queries`: MuSiQue's sub-questions with "#k" filled by the gold answers.
- `DensePassageSearch`: passages nearest to a query ("title\ntext", exact cosine); on each gold
  sub-question, hops interleaved rank by rank, it is `dense-iterative`: no graph, so it isolates
  what the hypergraph adds beyond the decomposition itself.
- `hyperprove_chain`: `HypergraphRetriever` hop by hop on the same sub-questions, carrying the
  frontier F_t = F_{t-1} ∪ top-K. Each hop ranks passages by its scored candidates (so its top-K
  facts' passages come first), and the hops are interleaved rank by rank, de-duplicated
  (METHOD.md: interleaving beat hop-after-hop on Recall@2).
- `evaluate_ranker`: Recall@k and timing of any ranking over a question set.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from experiments.data import Question
from experiments.metrics import mean_percent, recall_at_k
from modules.errors import HyperProveError
from modules.lm.references import fill_references
from modules.retrieval.retriever import HypergraphRetriever, interleave_passages
from modules.retrieval.vectors import VectorIndex


def gold_sub_queries(question: Question) -> list[str]:
    """The gold sub-questions with every "#k" filled by the gold answer of step k."""
    if not question.decomposition:
        raise HyperProveError(f"question {question.id}: no gold decomposition (only MuSiQue carries one)")
    answers = [step.answer for step in question.decomposition]
    return [fill_references(step.question, answers) for step in question.decomposition]


class DensePassageSearch:
    """Passage ranking by cosine between the query and "title\\ntext" embeddings."""

    def __init__(self, index: VectorIndex, encode: Callable[[str], np.ndarray], depth: int = 10):
        self.index, self.encode, self.depth = index, encode, depth

    def __call__(self, query: str) -> list[int]:
        _, ids = self.index.search(self.encode(query), self.depth)
        return [int(i) for i in ids[0] if i >= 0]


def hyperprove_chain(question: Question, retriever: HypergraphRetriever) -> tuple[list[int], list[dict]]:
    """Hop by hop on the gold sub-questions, carrying the frontier; returns passages and traces."""
    frontier: list[int] = []
    hop_passages, traces = [], []
    for query in gold_sub_queries(question):
        hop = retriever(query, frontier=frontier)
        frontier = hop.frontier
        hop_passages.append(hop.passages)
        traces.append(hop.trace)
    return interleave_passages(hop_passages), traces


def evaluate_ranker(
    questions: Sequence[Question], rank: Callable[[Question], tuple[list[int], list]], ks: Sequence[int] = (2, 5), progress: str | None = None
) -> tuple[dict, list[dict]]:
    """Mean Recall@k over the questions with gold passages, and one row per question.

    `rank` gives the ranked passages and the evidence chain (per hop, whatever the system traces).
    """
    from tqdm import tqdm

    rows = []
    for question in tqdm(questions, desc=progress, unit="question", disable=progress is None):
        if not question.gold_passages:
            continue
        started = time.perf_counter()
        ranked, chain = rank(question)
        seconds = time.perf_counter() - started
        row = {"id": question.id, "question": question.question, "passages": list(ranked[: max(ks)]),
               "gold_passages": list(question.gold_passages), "chain": chain, "seconds": round(seconds, 6)}
        row.update({f"recall@{k}": recall_at_k(ranked, question.gold_passages, k) for k in ks})
        rows.append(row)
    if not rows:
        raise HyperProveError("no question with gold passages to evaluate")
    summary = {"n": len(rows)}
    summary.update({f"recall@{k}": mean_percent(rows, f"recall@{k}") for k in ks})
    seconds = float(np.mean([row["seconds"] for row in rows]))
    summary["seconds_per_question"] = round(seconds, 4)
    summary["retrieval_ms_per_question"] = round(1000 * seconds, 2)
    return summary, rows
