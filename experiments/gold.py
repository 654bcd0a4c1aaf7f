"""Retrieval with gold decompositions (no LM) and the two dense baselines beside it.

- `dense`: passages nearest to the question ("title\\ntext", exact cosine).
- `dense-iterative`: the same passage search on each gold sub-question ("#k" filled with the
  gold answers), per-hop rankings interleaved rank by rank. No graph: it isolates what the
  hypergraph adds beyond the decomposition itself.
- From the question alone (`experiments.baselines`): `bm25` over passages, and over the
  hypergraph index `ppr`
  (HippoRAG 2-style Personalized PageRank), `dense-facts` (passages of the nearest facts),
  `hypergraphrag` (one-shot expansion from the nearest entities) and `hyperprove-fixed`, the
  ablation: HyperProve's expansion on the fixed original question, with no carried frontier.
- `hyperprove`: `HypergraphRetriever` hop by hop on the same sub-questions, carrying the
  frontier F_t = F_{t-1} ∪ top-K. Passage ranking: each hop ranks passages by its scored
  candidates (so its top-K facts' passages come first), and the hops are interleaved rank by
  rank, de-duplicated (METHOD.md: interleaving beat hop-after-hop on Recall@2).
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from experiments.data import Question
from experiments.metrics import mean_percent, recall_at_k
from modules.errors import HyperProveError
from modules.retriever import HypergraphRetriever, RetrieverConfig, interleave_passages
from modules.steps import fill_references
from modules.vectors import VectorIndex

QUESTION_ONLY = ("bm25", "ppr", "dense-facts", "hypergraphrag", "hyperprove-fixed")
WITHOUT_INDEX = ("dense", "dense-iterative", "bm25")  # passage-level: no hypergraph index needed
RETRIEVERS = ("dense", "dense-iterative", "hyperprove", *QUESTION_ONLY)


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


def question_search(name: str, passages, index, encode: Callable[[str], np.ndarray], config: RetrieverConfig) -> Callable[[str], list[int]]:
    """The question-only passage search `name` (over the hypergraph index, except `bm25`)."""
    from experiments.baselines import BM25PassageSearch, DenseFactSearch, EntityExpansionSearch, PPRPassageSearch

    if name == "bm25":
        return BM25PassageSearch(passages)
    if name == "ppr":
        return PPRPassageSearch.from_index(index, encode)
    if name == "dense-facts":
        return DenseFactSearch(index.fact_index, index.fact_passage, encode)
    if name == "hypergraphrag":
        return EntityExpansionSearch.from_index(index, encode)
    if name == "hyperprove-fixed":
        retriever = index.retriever(config, encode)
        return lambda query: retriever(query).passages
    raise HyperProveError(f"no question-only search named {name!r} (available: {', '.join(QUESTION_ONLY)})")


def rank_dense(question: Question, search: DensePassageSearch) -> list[int]:
    return search(question.question)


def rank_dense_iterative(question: Question, search: DensePassageSearch) -> list[int]:
    return interleave_passages([search(q) for q in gold_sub_queries(question)])


def rank_hyperprove(question: Question, retriever: HypergraphRetriever) -> list[int]:
    return hyperprove_chain(question, retriever)[0]


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
    questions: Sequence[Question], rank: Callable[[Question], list[int]], ks: Sequence[int] = (2, 5), progress: str | None = None
) -> tuple[dict, list[dict]]:
    """Mean Recall@k over the questions with gold passages, and one row per question."""
    from tqdm import tqdm

    rows = []
    started = time.perf_counter()
    for question in tqdm(questions, desc=progress, unit="question", disable=progress is None):
        if not question.gold_passages:
            continue
        ranked = rank(question)
        row = {"id": question.id, "ranked_passages": ranked[: max(ks)], "gold_passages": list(question.gold_passages)}
        row.update({f"recall@{k}": recall_at_k(ranked, question.gold_passages, k) for k in ks})
        rows.append(row)
    if not rows:
        raise HyperProveError("no question with gold passages to evaluate")
    elapsed = time.perf_counter() - started
    summary = {"n": len(rows)}
    summary.update({f"recall@{k}": mean_percent(rows, f"recall@{k}") for k in ks})
    summary["seconds_per_question"] = round(elapsed / len(rows), 4)
    return summary, rows
