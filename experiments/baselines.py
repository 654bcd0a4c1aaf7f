"""Peer baselines over the same index, embedder and evidence budget as HyperProve.

Each is a passage search: query text in, passage ids out, best first.

- `BM25PassageSearch`: lexical BM25 (`bm25s`, Lucene variant, k1 1.5, b 0.75, English
  stopwords) over "title\ntext", the text the dense passage search embeds.
- `DenseFactSearch`: the facts nearest to the query, their passages in order of first appearance.
- `EntityExpansionSearch`: HyperGraphRAG's one-shot expansion. The entities nearest to the query
  (by their name vectors) bring in every fact (hyperedge) that names them, beside the facts
  nearest to the query; the candidates are ranked by cosine to the query, and passages follow.
  No walk, no hops: what answer guidance adds over this is the point of the comparison.

`PPRPassageSearch` is HippoRAG 2's retrieval, as its paper and code describe it, on this
project's index: a graph of entity ("phrase") nodes and passage nodes, seeded from the facts
that match the query, ranked by Personalized PageRank mass.

- Edges (undirected, weight 1): entity-passage when the entity is named by a fact of the passage
  (HippoRAG's context edges), entity-entity when two entities are named by one fact (its
  relation edges) or are synonyms (its synonym edges).
- Reset vector: the `link_top_k` facts nearest to the query give their cosine to each of their
  entities, and an entity's weight is divided by the number of passages that name it (HippoRAG
  2's damping of frequent phrases). Every passage gets `passage_node_weight` (0.05) times its
  min-max-normalised dense score. The vector is normalised to sum 1.
- PageRank: damping 0.5 (probability of following an edge), power iteration to an L1 change
  below 1e-6; the mass of nodes without edges returns through the reset vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp

from modules.retrieval.hypergraph import binary_csr
from modules.retrieval.retriever import unique_in_order
from modules.retrieval.vectors import VectorIndex


def personalized_pagerank(
    transitions: sp.csr_matrix,
    reset: np.ndarray,
    damping: float = 0.5,
    tol: float = 1e-6,
    max_iter: int = 100,
    dangling: np.ndarray | None = None,
) -> np.ndarray:
    """r = (1 - d) s + d (P r + dangling mass * s), by power iteration from s.

    `transitions` is column-stochastic except for all-zero columns (nodes without edges), whose
    mass is sent back through the reset vector, so r stays a probability distribution. Pass
    `dangling` (those columns, as a mask) to save a pass over the matrix per query.
    """
    reset = np.asarray(reset, dtype=np.float64)
    reset = reset / reset.sum()
    if dangling is None:
        dangling = dangling_nodes(transitions)
    rank = reset.copy()
    for _ in range(max_iter):
        updated = (1 - damping) * reset + damping * (transitions @ rank + rank[dangling].sum() * reset)
        if np.abs(updated - rank).sum() < tol:
            return updated
        rank = updated
    return rank


def dangling_nodes(transitions: sp.csr_matrix) -> np.ndarray:
    return np.asarray(transitions.sum(axis=0)).ravel() == 0


def column_stochastic(adjacency: sp.spmatrix) -> sp.csr_matrix:
    degree = np.asarray(adjacency.sum(axis=0)).ravel()
    return (sp.csr_matrix(adjacency) @ sp.diags(np.divide(1.0, degree, out=np.zeros_like(degree, dtype=np.float64), where=degree > 0))).tocsr()


class BM25PassageSearch:
    """Passages by BM25 score against the query (see the module docstring)."""

    def __init__(self, passages, depth: int = 10):
        import bm25s

        self.bm25s, self.depth = bm25s, depth
        texts = [p.titled_text for p in passages]
        self.retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
        self.retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
        self.n_passages = len(texts)

    def __call__(self, query: str) -> list[int]:
        tokens = self.bm25s.tokenize([query], stopwords="en", show_progress=False)
        ids, _ = self.retriever.retrieve(tokens, k=min(self.depth, self.n_passages), show_progress=False, n_threads=1)
        return ids[0].tolist()


class DenseFactSearch:
    """Passages of the `fact_depth` facts nearest to the query, in order of the best fact."""

    def __init__(self, fact_index: VectorIndex, fact_passage: np.ndarray, encode: Callable[[str], np.ndarray], depth: int = 10, fact_depth: int = 100):
        self.fact_index, self.fact_passage, self.encode = fact_index, np.asarray(fact_passage), encode
        self.depth, self.fact_depth = depth, fact_depth

    def __call__(self, query: str) -> list[int]:
        _, ids = self.fact_index.search(self.encode(query), self.fact_depth)
        facts = ids[0][ids[0] >= 0]
        return unique_in_order(self.fact_passage[facts])[: self.depth]


class EntityExpansionSearch:
    """HyperGraphRAG-style one-shot expansion from the entities matched to the query."""

    def __init__(
        self,
        fact_entities: sp.csr_matrix,
        fact_vectors: np.ndarray,
        fact_index: VectorIndex,
        entity_index: VectorIndex,
        fact_passage: np.ndarray,
        encode: Callable[[str], np.ndarray],
        n_entities: int = 10,
        n_facts: int = 10,
        depth: int = 10,
    ):
        self.facts_of_entity = sp.csc_matrix(fact_entities)
        self.fact_vectors, self.fact_index, self.entity_index = fact_vectors, fact_index, entity_index
        self.fact_passage, self.encode = np.asarray(fact_passage), encode
        self.n_entities, self.n_facts, self.depth = n_entities, n_facts, depth

    @classmethod
    def from_index(cls, index, encode: Callable[[str], np.ndarray], **options) -> "EntityExpansionSearch":
        return cls(index.fact_entities, index.fact_vectors, index.fact_index, index.entity_index, index.fact_passage, encode, **options)

    def __call__(self, query: str) -> list[int]:
        vector = np.asarray(self.encode(query), dtype=np.float32).ravel()
        _, entity_ids = self.entity_index.search(vector, self.n_entities)
        _, fact_ids = self.fact_index.search(vector, self.n_facts)
        entities = entity_ids[0][entity_ids[0] >= 0]
        expanded = self.facts_of_entity[:, entities].indices
        candidates = np.union1d(fact_ids[0][fact_ids[0] >= 0], expanded).astype(np.int64)
        cos = self.fact_vectors[candidates] @ vector
        ranked = candidates[np.lexsort((candidates, -cos))]
        return unique_in_order(self.fact_passage[ranked])[: self.depth]


@dataclass
class PPRConfig:
    link_top_k: int = 5  # facts matched to the query that seed entity nodes
    passage_node_weight: float = 0.05  # HippoRAG 2's weight of the dense passage scores in the reset
    damping: float = 0.5
    depth: int = 10  # passages returned


class PPRPassageSearch:
    """HippoRAG 2-style Personalized PageRank over entities and passages (see the module docstring)."""

    def __init__(
        self,
        fact_entities: sp.csr_matrix,
        synonyms: sp.csr_matrix,
        fact_passage: np.ndarray,
        n_passages: int,
        fact_search: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]],
        passage_vectors: np.ndarray,
        encode: Callable[[str], np.ndarray],
        config: PPRConfig | None = None,
    ):
        self.config = config or PPRConfig()
        self.encode, self.fact_search, self.passage_vectors = encode, fact_search, passage_vectors
        n_facts, n_entities = fact_entities.shape
        entities = binary_csr(*fact_entities.nonzero(), (n_facts, n_entities))
        in_passage = binary_csr(np.arange(n_facts), np.asarray(fact_passage), (n_facts, n_passages))
        entity_passage = binary_csr(*(entities.T @ in_passage).nonzero(), (n_entities, n_passages))
        related = (entities.T @ entities + synonyms).tocoo()
        off_diagonal = related.row != related.col
        entity_entity = binary_csr(related.row[off_diagonal], related.col[off_diagonal], (n_entities, n_entities))
        adjacency = sp.bmat([[entity_entity, entity_passage], [entity_passage.T, None]], format="csr")
        self.transitions = column_stochastic(adjacency)
        self.dangling = dangling_nodes(self.transitions)
        self.fact_entities = entities
        self.passages_per_entity = np.asarray(entity_passage.sum(axis=1)).ravel()
        self.n_entities, self.n_passages = n_entities, n_passages

    @classmethod
    def from_index(cls, index, encode: Callable[[str], np.ndarray], config: PPRConfig | None = None) -> "PPRPassageSearch":
        """Over a `pipeline.index.build.HypergraphIndex`: its facts, synonyms and vector indexes."""

        def fact_search(vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
            scores, ids = index.fact_index.search(vector, k)
            return scores[0], ids[0]

        return cls(index.fact_entities, index.synonyms, index.fact_passage, len(index.passages), fact_search,
                   index.passage_vectors, encode, config)

    def link(self, query_vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The `link_top_k` facts nearest to the query and their cosines: HippoRAG 2's seeds."""
        scores, ids = self.fact_search(query_vector, self.config.link_top_k)
        keep = ids >= 0
        return ids[keep], scores[keep]

    def reset_vector(self, query_vector: np.ndarray, seeds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Seed facts (default: `link`) weight their entities; every passage adds its dense score."""
        ids, scores = self.link(query_vector) if seeds is None else seeds
        entity_weight = np.asarray(self.fact_entities[ids].T @ scores).ravel()
        entity_weight = np.divide(entity_weight, self.passages_per_entity, out=np.zeros_like(entity_weight), where=self.passages_per_entity > 0)
        dense = self.passage_vectors @ query_vector
        spread = dense.max() - dense.min()
        normalised = (dense - dense.min()) / spread if spread > 0 else np.ones_like(dense)
        return np.concatenate([entity_weight, self.config.passage_node_weight * normalised])

    def ranked(self, query_vector: np.ndarray, seeds: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Every passage, by PPR mass (ties by id)."""
        rank = personalized_pagerank(self.transitions, self.reset_vector(query_vector, seeds), self.config.damping, dangling=self.dangling)
        passage_mass = rank[self.n_entities :]
        return np.lexsort((np.arange(self.n_passages), -passage_mass))

    def __call__(self, query: str) -> list[int]:
        query_vector = np.asarray(self.encode(query), dtype=np.float32).ravel()
        return self.ranked(query_vector)[: self.config.depth].tolist()


@dataclass
class BeamConfig:
    subgraph_passages: int = 20  # stage 1: the beam walks the facts of this many PPR-ranked passages
    start_facts: int = 200  # facts scored as one-fact paths (PropRAG: 200)
    beam_width: int = 4  # paths kept per length (PropRAG: 4)
    max_path_length: int = 3  # facts per path (PropRAG: 3)
    parallel_starts: int = 3  # best one-fact paths every path may jump to (PropRAG's "non-chain" step)
    depth: int = 10  # passages returned


class BeamPathSearch:
    """PropRAG-style retrieval: LM-free beam search over fact paths scored against the question.

    1. Stage 1: HippoRAG 2-style PPR (`PPRPassageSearch`) ranks passages; the facts of the top
       `subgraph_passages` are the ones the beam may visit.
    2. Stage 2: the `start_facts` facts nearest to the query are one-fact paths; the best
       `beam_width` form the beam. A path grows by a fact that shares an entity (or a synonym)
       with its last fact, or by one of the `parallel_starts` best first facts. A path's score is
       the cosine between the query and the normalised mean of its fact vectors (PropRAG's
       "average" combination: no re-embedding at query time). The best `beam_width` new paths
       of each length form the next beam; paths are sets, so a reordering is not new.
    3. Each kept path adds its score to each of its facts; these fact scores seed the same PPR
       in place of HippoRAG 2's top-k linked facts (PropRAG's entities from paths), and passages
       are ranked by PPR mass.
    """

    def __init__(self, ppr: PPRPassageSearch, synonyms: sp.csr_matrix, fact_vectors: np.ndarray, fact_passage: np.ndarray,
                 encode: Callable[[str], np.ndarray], config: BeamConfig | None = None):
        self.ppr, self.fact_vectors, self.encode = ppr, fact_vectors, encode
        self.config = config or BeamConfig()
        entities = ppr.fact_entities
        n_facts, n_entities = entities.shape
        same_or_synonym = sp.identity(n_entities, format="csr") + binary_csr(*synonyms.nonzero(), (n_entities, n_entities))
        self.linked_entities = (entities @ same_or_synonym).tocsr()  # facts x entities they connect through
        self.facts_of_entity = entities.T.tocsr()
        self.facts_of_passage = binary_csr(np.asarray(fact_passage), np.arange(n_facts), (ppr.n_passages, n_facts))

    @classmethod
    def from_index(cls, index, encode: Callable[[str], np.ndarray], config: BeamConfig | None = None) -> "BeamPathSearch":
        ppr = PPRPassageSearch.from_index(index, encode)
        return cls(ppr, index.synonyms, index.fact_vectors, index.fact_passage, encode, config)

    def neighbours(self, fact: int) -> np.ndarray:
        """Facts sharing an entity or a synonym with `fact` (itself included)."""
        return (self.linked_entities[fact] @ self.facts_of_entity).indices

    def paths(self, query_vector: np.ndarray, allowed: np.ndarray) -> list[tuple[tuple[int, ...], float]]:
        """Every path the beam kept, with its score (step 2 of the class docstring)."""
        config = self.config
        allowed = np.unique(allowed)
        cos = self.fact_vectors[allowed] @ query_vector
        order = np.lexsort((allowed, -cos))[: config.start_facts]
        starts = [((int(allowed[k]),), float(cos[k])) for k in order]
        parallel = np.array([path[0] for path, _ in starts[: config.parallel_starts]], dtype=np.int64)
        beam = starts[: config.beam_width]
        kept, seen = list(beam), {frozenset(path) for path, _ in beam}
        for _ in range(1, config.max_path_length):
            grown = []
            for path, _ in beam:
                nexts = np.union1d(np.intersect1d(self.neighbours(path[-1]), allowed, assume_unique=True), parallel)
                nexts = nexts[~np.isin(nexts, path)]
                total = self.fact_vectors[list(path)].sum(axis=0) + self.fact_vectors[nexts]
                scores = (total @ query_vector) / np.linalg.norm(total, axis=1)
                for fact, score in zip(nexts.tolist(), scores.tolist()):
                    key = frozenset(path + (fact,))
                    if key not in seen:
                        seen.add(key)
                        grown.append((path + (fact,), score))
            if not grown:
                break
            beam = sorted(grown, key=lambda item: (-item[1], item[0]))[: config.beam_width]
            kept.extend(beam)
        return kept

    @staticmethod
    def fact_scores(paths: list[tuple[tuple[int, ...], float]]) -> tuple[np.ndarray, np.ndarray]:
        """Each fact's summed path scores, as (fact ids, scores) seeds for PPR."""
        totals: dict[int, float] = {}
        for path, score in paths:
            for fact in path:
                totals[fact] = totals.get(fact, 0.0) + score
        ids = np.array(sorted(totals), dtype=np.int64)
        return ids, np.array([totals[f] for f in ids.tolist()], dtype=np.float64)

    def __call__(self, query: str) -> list[int]:
        query_vector = np.asarray(self.encode(query), dtype=np.float32).ravel()
        subgraph = self.ppr.ranked(query_vector)[: self.config.subgraph_passages]
        allowed = self.facts_of_passage[subgraph].indices
        if not len(allowed):
            return subgraph[: self.config.depth].tolist()
        seeds = self.fact_scores(self.paths(query_vector, allowed))
        return self.ppr.ranked(query_vector, seeds)[: self.config.depth].tolist()
