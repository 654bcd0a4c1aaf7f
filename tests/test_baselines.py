"""Baselines on tiny graphs whose answers are worked out by hand."""

import numpy as np
import pytest
import scipy.sparse as sp

from experiments.baselines import PPRConfig, PPRPassageSearch, column_stochastic, personalized_pagerank
from tests.conftest import incidence

# f0 in P0 names a; f1 in P1 names a and b; f2 in P2 names c; P3 has no facts.
FACTS = [[0], [0, 1], [2]]
PASSAGE_OF = np.array([0, 1, 2])


def search(seed_scores):
    """A fact search that returns fixed (score, id) pairs, best first."""
    ids = np.array(list(seed_scores), dtype=np.int64)
    scores = np.array(list(seed_scores.values()), dtype=np.float32)
    return lambda vector, k: (scores[:k], ids[:k])


def ppr(seed_scores, passage_vectors, passage_node_weight, n_passages=3):
    return PPRPassageSearch(
        incidence(FACTS, 3), sp.csr_matrix((3, 3)), PASSAGE_OF, n_passages, search(seed_scores),
        passage_vectors, lambda q: np.array([1.0, 0.0], dtype=np.float32),
        PPRConfig(link_top_k=1, passage_node_weight=passage_node_weight),
    )


def test_ppr_mass_matches_the_hand_solution():
    # Reset on entity a alone. By hand (nodes a, b, c, P0, P1, P2; r = s/2 + P r/2):
    # r_P0 = r_a/6, r_b = r_P1 = 2 r_a/9, r_a = 1/2 + 7 r_a/36, so r_a = 18/29, r_P0 = 3/29, r_P1 = 4/29.
    search_ppr = ppr({0: 1.0}, np.zeros((3, 2), dtype=np.float32), passage_node_weight=0.0)
    rank = personalized_pagerank(search_ppr.transitions, search_ppr.reset_vector(np.array([1.0, 0.0], dtype=np.float32)))
    np.testing.assert_allclose(rank, [18 / 29, 4 / 29, 0, 3 / 29, 4 / 29, 0], atol=1e-6)
    assert search_ppr("q") == [1, 0, 2]  # P1, linked to a and b, outranks P0 where the seed fact is


def test_reset_divides_entity_weight_by_passages_and_adds_dense_passage_scores():
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)  # dense scores 1, 0, 0.6
    reset = ppr({1: 0.8}, vectors, passage_node_weight=0.05).reset_vector(np.array([1.0, 0.0], dtype=np.float32))
    # fact 1 names a (in 2 passages) and b (in 1): 0.8 / 2 and 0.8 / 1; passages 0.05 * (1, 0, 0.6)
    np.testing.assert_allclose(reset, [0.4, 0.8, 0.0, 0.05, 0.0, 0.03], atol=1e-7)


def test_power_iteration_agrees_with_the_linear_solve_and_returns_dangling_mass():
    # P3 has no edges: its mass goes back through the reset vector.
    adjacency = sp.csr_matrix(np.array([
        [0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0],
    ], dtype=float))
    reset = np.array([0.5, 0.0, 0.0, 0.5])
    transitions = column_stochastic(adjacency)
    d = 0.5
    dangling = np.array([0, 0, 0, 1.0])
    expected = np.linalg.solve(np.eye(4) - d * transitions.toarray() - d * np.outer(reset, dangling), (1 - d) * reset)
    rank = personalized_pagerank(transitions, reset, damping=d, tol=1e-12, max_iter=200)
    np.testing.assert_allclose(rank, expected, atol=1e-9)
    assert rank.sum() == pytest.approx(1.0)


# Facts f0 (P0, names a), f1 (P1, a and b), f2 (P2, c), f3 (P3, c); query e0.
FACT_VECTORS = np.array([[1, 0, 0], [0.6, 0.8, 0], [0.8, 0, 0.6], [0, 0, 1]], dtype=np.float32)
ENTITY_VECTORS = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=np.float32)  # a, b, c
QUERY = {"q": np.array([1, 0, 0], dtype=np.float32)}


def test_dense_facts_ranks_passages_by_their_best_fact():
    from experiments.baselines import DenseFactSearch
    from modules.retrieval.vectors import VectorIndex

    search = DenseFactSearch(VectorIndex.build(FACT_VECTORS), [0, 1, 2, 3], QUERY.__getitem__, fact_depth=2)
    assert search("q") == [0, 2]  # f0 (cos 1.0), f2 (0.8); f1 (0.6) is beyond the fact depth
    search.fact_depth = 4
    assert search("q") == [0, 2, 1, 3]


def test_entity_expansion_brings_in_every_fact_of_the_matched_entities():
    from experiments.baselines import EntityExpansionSearch
    from modules.retrieval.vectors import VectorIndex

    search = EntityExpansionSearch(
        incidence([[0], [0, 1], [2], [2]], 3), FACT_VECTORS, VectorIndex.build(FACT_VECTORS), VectorIndex.build(ENTITY_VECTORS),
        np.array([0, 1, 2, 3]), QUERY.__getitem__, n_entities=1, n_facts=1,
    )
    # nearest entity c brings f2 and f3, nearest fact is f0; f1 (cos 0.6) is not a candidate.
    # ranked by cos: f0 (1.0), f2 (0.8), f3 (0.0) -> passages 0, 2, 3
    assert search("q") == [0, 2, 3]


def test_bm25_scores_by_hand():
    from experiments.baselines import BM25PassageSearch
    from modules.facts import Passage

    passages = [Passage("Jaws", "directed by Steven Spielberg"), Passage("Spielberg", "Spielberg directed films"), Passage("Ohio River", "a river")]
    search = BM25PassageSearch(passages)
    # Tokens without stopwords: d0 jaws directed steven spielberg (4), d1 spielberg spielberg directed films (4),
    # d2 ohio river river (3); avgdl 11/3. Query "who directed Jaws?" -> directed, jaws.
    # idf = ln(1 + (N - df + .5) / (df + .5)): jaws ln(8/3), directed ln(1.6); tf part 1 / (1 + 1.5 (0.25 + 0.75 * 4 / (11/3))).
    tf_part = 1 / (1 + 1.5 * (0.25 + 0.75 * 4 / (11 / 3)))
    expected = np.array([(np.log(8 / 3) + np.log(1.6)) * tf_part, np.log(1.6) * tf_part, 0.0])
    ids, scores = search.retriever.retrieve(search.bm25s.tokenize(["who directed Jaws?"], stopwords="en", show_progress=False), k=3, show_progress=False)
    np.testing.assert_allclose(scores[0], expected, rtol=1e-5)
    assert search("who directed Jaws?") == [0, 1, 2]


def beam_search(config):
    """f0 (P0, names A) = (1, 0); f1 (P1, A and B) = (0.6, 0.8); f2 (P2, B) = (0, 1); f3 (P3, C) = (0.8, -0.6)."""
    from experiments.baselines import BeamPathSearch

    vectors = np.array([[1, 0], [0.6, 0.8], [0, 1], [0.8, -0.6]], dtype=np.float32)
    fact_ids = np.arange(4)
    ppr_search = PPRPassageSearch(
        incidence([[0], [0, 1], [1], [2]], 3), sp.csr_matrix((3, 3)), fact_ids, 4, search({0: 1.0}),
        np.zeros((4, 2), dtype=np.float32), lambda q: np.array([1.0, 0.0], dtype=np.float32), PPRConfig(passage_node_weight=0.0),
    )
    return BeamPathSearch(ppr_search, sp.csr_matrix((3, 3)), vectors, fact_ids, ppr_search.encode, config)


def test_beam_search_keeps_the_paths_worked_out_by_hand():
    from experiments.baselines import BeamConfig

    beam = beam_search(BeamConfig(beam_width=2, max_path_length=2, parallel_starts=1, subgraph_passages=4))
    paths = beam.paths(np.array([1.0, 0.0], dtype=np.float32), np.arange(4))
    # One-fact paths by cosine: f0 1.0, f3 0.8 (the beam), f1 0.6, f2 0. Length 2: f0 reaches f1
    # through A, mean (0.8, 0.4) -> cos 1.6 / sqrt(3.2) = 0.894427; f3 shares nothing, but may jump
    # to the best start f0: mean (0.9, -0.3) -> cos 1.8 / sqrt(3.6) = 0.948683. f2 is never reached.
    assert [path for path, _ in paths] == [(0,), (3,), (3, 0), (0, 1)]
    np.testing.assert_allclose([score for _, score in paths], [1.0, 0.8, 0.948683, 0.894427], atol=1e-6)
    ids, scores = beam.fact_scores(paths)
    assert ids.tolist() == [0, 1, 3]
    np.testing.assert_allclose(scores, [1.0 + 0.948683 + 0.894427, 0.894427, 0.8 + 0.948683], atol=1e-6)


def test_beam_search_never_leaves_the_stage_one_subgraph_and_seeds_ppr_with_path_scores():
    from experiments.baselines import BeamConfig

    beam = beam_search(BeamConfig(beam_width=2, max_path_length=3, parallel_starts=1))
    query = np.array([1.0, 0.0], dtype=np.float32)
    paths = beam.paths(query, np.array([0, 1, 2]))  # f3 outside: f0 -> f1 -> f2 along A, then B
    assert [path for path, _ in paths] == [(0,), (1,), (0, 1), (1, 2), (0, 1, 2)]
    # By hand: starts f0 1.0, f1 0.6 (f2 0); f0 -> f1 (0.894427); f1 -> f2 (0.316228; f1 -> f0 is the
    # same set as f0 -> f1); then f0 -> f1 -> f2 (1.6 / sqrt(5.8) = 0.664364).
    np.testing.assert_allclose([score for _, score in paths], [1.0, 0.6, 0.894427, 0.316228, 0.664364], atol=1e-6)

    # The ranking is PPR seeded by the path-scored facts (the hand example of the previous test).
    beam.config = BeamConfig(beam_width=2, max_path_length=2, parallel_starts=1, subgraph_passages=4)
    ids, scores = beam.fact_scores(beam.paths(query, np.arange(4)))
    assert beam("q") == beam.ppr.ranked(query, (ids, scores)).tolist()
    reset = beam.ppr.reset_vector(query, (ids, scores))
    # entity A: f0 (2.843110) and f1 (0.894427), in 2 passages; B: f1, in 2; C: f3 (1.748683), in 1
    np.testing.assert_allclose(reset[:3], [(2.843110 + 0.894427) / 2, 0.894427 / 2, 1.748683], atol=1e-5)
