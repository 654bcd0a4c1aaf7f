"""Shared fixtures: the hand-worked 6-fact hypergraph and a deterministic test embedder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from modules.facts import Passage
from modules.retrieval.hypergraph import Hypergraph, binary_csr
from modules.retrieval.retriever import FactTable, HypergraphRetriever, RetrieverConfig
from modules.retrieval.vectors import VectorIndex
from tests.support import CORPUS, QUESTIONS, HashEmbedder, run

# Facts 0-2 in passage 0, facts 3-4 in passage 1, fact 5 alone in passage 2.
# Entities: a = 0 (facts 0, 1), b = 1 (facts 1, 3), c = 2 (facts 3, 4), d = 3 (fact 5).
FACT_ENTITIES = [[0], [0, 1], [], [1, 2], [2], [3]]
FACT_PASSAGE = [0, 0, 0, 1, 1, 2]
# cos of each fact with query "q1" = e0 and with query "q2" = e2 (the rest of the norm in e1).
COS_Q1 = [0.9, 0.1, 0.5, 0.2, 0.3, 0.25]
COS_Q2 = [0.0, 0.1, 0.0, 0.3, 0.9, 0.2]


def incidence(fact_entities, n_entities):
    rows = [i for i, ents in enumerate(fact_entities) for _ in ents]
    cols = [e for ents in fact_entities for e in ents]
    return binary_csr(np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64), (len(fact_entities), n_entities))


@pytest.fixture
def hand_graph() -> Hypergraph:
    return Hypergraph(incidence(FACT_ENTITIES, 4), np.array(FACT_PASSAGE), 3)


@pytest.fixture
def hand_vectors() -> np.ndarray:
    c1, c2 = np.array(COS_Q1), np.array(COS_Q2)
    return np.stack([c1, np.sqrt(1 - c1**2 - c2**2), c2], axis=1).astype(np.float32)


QUERIES = {"q1": np.array([1.0, 0.0, 0.0], dtype=np.float32), "q2": np.array([0.0, 0.0, 1.0], dtype=np.float32)}


@pytest.fixture
def make_retriever(hand_graph, hand_vectors):
    def make(name_entities=None, lexical=None, **config) -> HypergraphRetriever:
        table = FactTable(
            text=[f"fact {i}" for i in range(6)],
            passage=np.array(FACT_PASSAGE),
            passages=[Passage(f"P{k}", f"passage {k}") for k in range(3)],
            vectors=hand_vectors,
            index=VectorIndex.build(hand_vectors),
            entity_facts=incidence(FACT_ENTITIES, 4).T.tocsr(),
        )
        defaults = dict(n_seeds=1, walk_steps=2, push_epsilon=0.0, lexical_seeds=0, lexical_weight=0.0)  # the dense search, worked by hand
        return HypergraphRetriever(hand_graph, table, QUERIES.__getitem__, RetrieverConfig(**{**defaults, **config}), name_entities, lexical)

    return make


@pytest.fixture
def files(tmp_path):
    """The tiny corpus and questions as files, in the test's folder."""
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
    return tmp_path


@pytest.fixture
def saved(files, capsys):
    """The tiny corpus indexed with the hash embedder, through the command line."""
    assert run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    return files / "idx"


@pytest.fixture
def hash_embedder() -> HashEmbedder:
    return HashEmbedder()


def dense(matrix) -> np.ndarray:
    return matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)
