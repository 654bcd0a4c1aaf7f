"""`HypergraphRetriever`: answer-guided, bounded expansion over the fact hypergraph (steps 6-9).

Deterministic and free of LM calls and I/O: it reads only the in-memory hypergraph, the fact
vectors and the query encoder it was given.

Choices where METHOD.md leaves the paper silent:
- Seeds (step 6): the `n_seeds` facts nearest to the query, united with the carried frontier.
- Subgraph (step 7): `walk_steps` steps of a random walk over T_s from the uniform
  distribution on the seeds; the `subgraph_bound` facts of largest summed visiting mass, with
  every seed always kept (see `Hypergraph.local_subgraph`).
- Distance 0: facts of the carried frontier are kept, not re-ranked; candidates are new facts.
- struct on the first hop (F_0 empty): the inverse distance to the dense seeds, and a seed
  itself (distance 0) gets struct 1. Later hops measure the distance to the frontier, and all
  candidates are outside it, so their distance is at least 1: struct = 1 / max(d, 1) throughout.
- Ties in the score are broken by fact id, so the ranking is a pure function of the input.

One addition to step 9, where the paper's score has no term for it: a fact that names an entity
the query names gets `entity_weight` (beta) more, so the facts of "Sudden Fear" can outrank
facts that match "publication date" better by cosine. The entities come from `name_entities`,
which the index supplies (its own naming rules over its own entity vocabulary), and a fact
names an entity when its own A_i holds it: through synonyms the bonus spread to near names and
gained less on 2Wiki train. beta = 0.1 was chosen on 2Wiki train (gold steps); the README
("Optimisation") has the train choice and the held-out figures.

Two more additions read the words themselves (`modules.retrieval.lexical`), for names a small
embedder blurs (a manual's flags and settings): `lexical_seeds` facts of highest BM25 join the
dense seeds in step 6 (and, on the first hop, the targets struct measures distance to), and
`lexical_weight` adds a candidate's BM25 score, as a share of the best fact's for the query, to
its score in step 9.

With `entity_facts` N, the hop's facts also hold the N facts nearest the query among those that
name an entity the query names, wherever they lie in the hypergraph (the bounded search of
steps 7-8 may not reach the bridge entity's own passage); their passages rank right after the
top K's. They join the frontier like the top K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import dspy
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from modules.config import RetrieverConfig
from modules.errors import HyperProveError
from modules.facts import Passage, ScoredFact
from modules.retrieval.hypergraph import Hypergraph
from modules.retrieval.vectors import CodedRows, VectorIndex


@dataclass
class FactTable:
    """What the retriever reads about facts besides the graph: text, provenance, unit vectors."""

    text: Sequence[str]
    passage: np.ndarray
    passages: Sequence[Passage]  # the corpus, by passage id: titles for facts, texts for readers
    vectors: np.ndarray | CodedRows  # unit vectors by fact id, or their codes (`rows[ids]` reads them alike)
    index: VectorIndex
    entity_facts: sp.csr_matrix | None = None  # entities x facts: the facts that name each entity (A_i, before synonyms)


def hop_distances(edges: sp.csr_matrix, sources: np.ndarray, limit: float = np.inf) -> np.ndarray:
    """Unweighted shortest-path length from the nearest source to every node (inf: unreachable)."""
    if len(sources) == 0:
        return np.full(edges.shape[0], np.inf)
    return dijkstra(edges, directed=True, indices=sources, unweighted=True, min_only=True, limit=limit)


class HypergraphRetriever(dspy.Module):
    """Query + carried frontier -> top-K scored facts, the new frontier, and a trace."""

    def __init__(
        self,
        hypergraph: Hypergraph,
        facts: FactTable,
        encode: Callable[[str], np.ndarray],
        config: RetrieverConfig | None = None,
        name_entities: Callable[[str], Sequence[int]] | None = None,
        lexical: Callable[[str], np.ndarray] | None = None,
    ):
        """`name_entities(query)` gives the ids of the entities a query names (None: no query names
        any); `lexical(query)` every fact's BM25 score (needed only with `lexical_seeds` or `lexical_weight`)."""
        super().__init__()
        self.hypergraph = hypergraph
        self.facts = facts
        self.encode = encode
        self.config = config or RetrieverConfig()
        self.name_entities = name_entities
        self.lexical = lexical

    def __deepcopy__(self, memo) -> "HypergraphRetriever":
        """Read-only, so copies share it: DSPy copies a program to compile or load it, and a copy
        of the index (and of the embedder behind `encode`) would cost memory and time for nothing."""
        return self

    def forward(self, query: str, frontier: Sequence[int] = ()) -> dspy.Prediction:
        config = self.config
        query_vector = np.asarray(self.encode(query), dtype=np.float32).ravel()
        frontier = np.array(list(dict.fromkeys(int(f) for f in frontier)), dtype=np.int64)
        if len(frontier) and (frontier.min() < 0 or frontier.max() >= self.hypergraph.n_facts):
            raise HyperProveError(f"frontier: fact ids must lie in [0, {self.hypergraph.n_facts}), got {frontier.tolist()}")

        # Step 6: dense (and lexical) seeds together with the carried frontier.
        _, ids = self.facts.index.search(query_vector, config.n_seeds)
        dense_seeds = ids[0][ids[0] >= 0].astype(np.int64)
        lexical = None
        if config.lexical:
            if self.lexical is None:
                raise HyperProveError("retriever: lexical_seeds and lexical_weight need the facts' BM25 scores (`lexical=`, which "
                                      "HypergraphIndex.retriever gives); none were given: set both to 0 for the dense search alone")
            lexical = np.asarray(self.lexical(query), dtype=np.float32)
        lexical_seeds = top_scoring(lexical, config.lexical_seeds) if config.lexical_seeds else np.zeros(0, dtype=np.int64)
        entry = np.union1d(dense_seeds, lexical_seeds)
        seeds = np.union1d(entry, frontier)

        # Step 7: bounded local subgraph and its renormalised transitions T*.
        nodes = self.hypergraph.local_subgraph(seeds, config.subgraph_bound, config.walk_steps, config.push_epsilon)
        local = self.hypergraph.local_transitions(nodes)

        # Step 8: N_theta and a breadth-first search of at most L steps from the seeds.
        edges = (local > config.theta).astype(np.float64).tocsr()
        from_seeds = hop_distances(edges, np.searchsorted(nodes, seeds), limit=config.depth)
        in_frontier = np.isin(nodes, frontier)
        candidates = np.flatnonzero(np.isfinite(from_seeds) & ~in_frontier)

        # Step 9: score = alpha * cos + (1 - alpha) * struct (+ beta where a fact names a named entity).
        targets = frontier if len(frontier) else entry
        to_targets = hop_distances(edges.T.tocsr(), np.searchsorted(nodes, targets))[candidates]
        struct = np.where(np.isfinite(to_targets), 1.0 / np.maximum(to_targets, 1.0), 0.0)
        candidate_ids = nodes[candidates]
        cos = self.facts.vectors[candidate_ids] @ query_vector
        no_entities = np.zeros(0, dtype=np.int64)
        query_entities = self.named_entities(query) if config.entity_weight or config.entity_facts else no_entities
        named_entities = query_entities if config.entity_weight else no_entities  # the ones whose facts get the bonus
        names_one = np.isin(candidate_ids, self.facts.entity_facts[named_entities].indices) if len(named_entities) else False
        score = config.alpha * cos + (1.0 - config.alpha) * struct + config.entity_weight * names_one
        best_lexical = lexical.max() if config.lexical_weight else 0.0
        if best_lexical > 0:
            score = score + config.lexical_weight * lexical[candidate_ids] / best_lexical
        order = np.lexsort((candidate_ids, -score))
        top = [self._scored(candidate_ids[k], cos[k], struct[k], score[k]) for k in order[: config.top_k]]
        ranked_ids = candidate_ids[order]
        if config.entity_facts:
            led = self.entity_led(query_entities, query_vector, np.union1d(frontier, ranked_ids[: config.top_k]), config.entity_facts)
            top += led
            led_ids = np.array([fact.id for fact in led], dtype=np.int64)
            ranked_ids = np.concatenate([ranked_ids[: config.top_k], led_ids, ranked_ids[config.top_k:][~np.isin(ranked_ids[config.top_k:], led_ids)]])

        new_frontier = [int(f) for f in frontier] + [f.id for f in top]
        trace = {
            "query": query,
            "dense_seeds": dense_seeds.tolist(),
            "lexical_seeds": lexical_seeds.tolist(),
            "named_entities": named_entities.tolist(),
            "frontier_in": frontier.tolist(),
            "subgraph_size": int(len(nodes)),
            "subgraph_edges": int(edges.nnz),
            "candidates": int(len(candidates)),
            "facts": [f.to_dict() for f in top],
        }
        passages = unique_in_order(self.facts.passage[ranked_ids])
        return dspy.Prediction(facts=top, frontier=new_frontier, ranked_ids=ranked_ids, passages=passages, trace=trace,
                               query_vector=query_vector)

    def passage_facts(self, passage: int, query_vector: np.ndarray, exclude: Sequence[int] = (), n: int | None = None) -> list[ScoredFact]:
        """The first `n` facts of `passage` in the passage's own order, but `exclude`, scored by
        cosine alone (struct 0): the rest of what a passage says about its subject, where the
        top K facts of a hop hold only some of its sentences."""
        ids = self.hypergraph.B_dh.indices[self.hypergraph.B_dh.indptr[passage]:self.hypergraph.B_dh.indptr[passage + 1]]
        ids = np.sort(ids[~np.isin(ids, np.asarray(exclude, dtype=np.int64))])[:n]
        cos = self.facts.vectors[ids] @ np.asarray(query_vector, dtype=np.float32).ravel()
        return [self._scored(fact_id, c, 0.0, self.config.alpha * c) for fact_id, c in zip(ids, cos)]

    def entity_led(self, entities: np.ndarray, query_vector: np.ndarray, exclude: np.ndarray, n: int) -> list[ScoredFact]:
        """The n facts nearest the query (cosine, ties by id) among the facts that name one of the
        query's `entities`, other than `exclude`; scored as a candidate with struct 0 and the bonus."""
        if not len(entities):
            return []
        ids = np.setdiff1d(self.facts.entity_facts[entities].indices, exclude)
        cos = self.facts.vectors[ids] @ query_vector
        config = self.config
        return [self._scored(ids[k], cos[k], 0.0, config.alpha * cos[k] + config.entity_weight) for k in np.lexsort((ids, -cos))[:n]]

    def named_entities(self, query: str) -> np.ndarray:
        """The entities the query names (distinct ids, sorted); none without a namer or the
        entities' facts to look them up in."""
        if self.name_entities is None or self.facts.entity_facts is None:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.asarray(self.name_entities(query), dtype=np.int64))

    def _scored(self, fact_id: int, cos: float, struct: float, score: float) -> ScoredFact:
        passage = int(self.facts.passage[fact_id])
        return ScoredFact(
            id=int(fact_id),
            text=self.facts.text[fact_id],
            passage=passage,
            title=self.facts.passages[passage].title,
            cos=float(cos),
            struct=float(struct),
            score=float(score),
        )


def top_scoring(scores: np.ndarray, n: int) -> np.ndarray:
    """The ids of the `n` highest positive scores, best first, ties by id."""
    positive = np.flatnonzero(scores > 0)
    if len(positive) > n:
        positive = positive[np.argpartition(-scores[positive], n - 1)[:n]]
    return positive[np.lexsort((positive, -scores[positive]))].astype(np.int64)


def unique_in_order(values: np.ndarray) -> list[int]:
    """Distinct values in order of first occurrence (ranked facts -> ranked passages)."""
    values = np.asarray(values)
    _, first = np.unique(values, return_index=True)
    return values[np.sort(first)].tolist()


def interleave_passages(hop_rankings: Sequence[Sequence[int]], limit: int | None = None) -> list[int]:
    """Merge per-hop passage rankings rank by rank (hop 1 #1, hop 2 #1, hop 1 #2, ...), de-duplicated.

    METHOD.md's measured hint: interleaving the hops gave Recall@2 61 against 49 for listing
    hop 1 before hop 2, at the same Recall@5.
    """
    merged: list[int] = []
    seen: set[int] = set()
    for rank in range(max((len(r) for r in hop_rankings), default=0)):
        for ranking in hop_rankings:
            if rank < len(ranking) and ranking[rank] not in seen:
                seen.add(ranking[rank])
                merged.append(ranking[rank])
                if limit is not None and len(merged) >= limit:
                    return merged
    return merged
