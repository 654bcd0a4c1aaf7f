"""T_s, synonyms and the local subgraph on the 6-fact example worked out by hand in conftest."""

import numpy as np
import pytest
from conftest import dense, incidence

from modules.errors import HyperProveError
from modules.retrieval.hypergraph import Hypergraph, binary_csr, expand_synonyms

# T_s by hand: W_s[i,j] = sum over shared entities of 1/D_e + [same passage]/D_d, diagonal
# removed, rows normalised. D_e = 2 for a, b, c; D_d = 3, 2, 1.
T_S = np.array([
    [0, 5 / 7, 2 / 7, 0, 0, 0],
    [1 / 2, 0, 1 / 5, 3 / 10, 0, 0],
    [1 / 2, 1 / 2, 0, 0, 0, 0],
    [0, 1 / 3, 0, 0, 2 / 3, 0],
    [0, 0, 0, 1, 0, 0],
    [0, 0, 0, 0, 0, 0],
])


def test_transition_rows_match_the_hand_computed_T_s(hand_graph):
    np.testing.assert_allclose(dense(hand_graph.transition_rows(np.arange(6))), T_S, atol=1e-12)


def test_rows_on_demand_equal_rows_of_the_whole(hand_graph):
    np.testing.assert_allclose(dense(hand_graph.transition_rows(np.array([3, 1]))), T_S[[3, 1]], atol=1e-12)


def test_self_weight_and_off_diagonal_sum(hand_graph):
    # W_s[1,1] = 1/2 (a) + 1/2 (b) + 1/3 (passage 0); off-diagonal sum = |A+| + 1 - W_s[1,1] = 5/3
    assert hand_graph.self_weight[1] == pytest.approx(4 / 3)
    assert hand_graph.off_diagonal_sum[1] == pytest.approx(5 / 3)
    assert hand_graph.off_diagonal_sum[5] == 0.0  # isolated fact: zero row, not NaN


def test_local_transitions_renormalise_the_restriction(hand_graph):
    local = dense(hand_graph.local_transitions(np.array([0, 1, 2, 3])))
    expected = np.array([[0, 5 / 7, 2 / 7, 0], [1 / 2, 0, 1 / 5, 3 / 10], [1 / 2, 1 / 2, 0, 0], [0, 1, 0, 0]])
    np.testing.assert_allclose(local, expected, atol=1e-12)


def test_walk_visits_by_hand(hand_graph):
    # From fact 0: step 1 = T_s[0] = {1: 5/7, 2: 2/7}; step 2 = {0: 1/2, 1: 1/7, 2: 1/7, 3: 3/14}.
    nodes, mass = hand_graph.propagate(np.array([0]), np.array([1.0]), epsilon=0.0)
    assert nodes.tolist() == [1, 2]
    np.testing.assert_allclose(mass, [5 / 7, 2 / 7])
    nodes, mass = hand_graph.propagate(nodes, mass, epsilon=0.0)
    assert nodes.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(mass, [1 / 2, 1 / 7, 1 / 7, 3 / 14])


def test_subgraph_bound_keeps_the_largest_visits_and_the_seeds(hand_graph):
    # visits: 1 -> 6/7, 2 -> 3/7, 3 -> 3/14; fact 4 is three steps away.
    assert hand_graph.local_subgraph(np.array([0]), bound=600, steps=2, epsilon=0.0).tolist() == [0, 1, 2, 3]
    assert hand_graph.local_subgraph(np.array([0]), bound=3, steps=2, epsilon=0.0).tolist() == [0, 1, 2]
    assert hand_graph.local_subgraph(np.array([0]), bound=2, steps=2, epsilon=0.0).tolist() == [0, 1]
    assert hand_graph.local_subgraph(np.array([0, 5]), bound=1, steps=2, epsilon=0.0).tolist() == [0, 5]


def test_push_epsilon_prunes_hubs(hand_graph):
    # From fact 1 (share 1/(5/3) = 3/5): entities a, b give 3/10 per fact, passage 0 gives 1/5.
    nodes, _ = hand_graph.propagate(np.array([1]), np.array([1.0]), epsilon=0.25)
    assert nodes.tolist() == [0, 3]  # the passage term (1/5 per fact) is below epsilon


def test_synonyms_join_facts_that_name_one_thing_differently():
    # fact 0 names entity 0 ("Big Apple"), fact 1 names entity 1 ("New York City"): no link.
    raw = incidence([[0], [1]], 2)
    assert dense(Hypergraph(raw, np.array([0, 1]), 2).transition_rows(np.arange(2))).sum() == 0
    synonyms = binary_csr(np.array([0, 1]), np.array([1, 0]), (2, 2))
    expanded = expand_synonyms(raw, synonyms)
    assert dense(expanded).tolist() == [[1, 1], [1, 1]]
    # now both facts hold both entities (D_e = 2): W_s[0,1] = 1/2 + 1/2, so T_s[0,1] = 1
    np.testing.assert_allclose(dense(Hypergraph(expanded, np.array([0, 1]), 2).transition_rows(np.arange(2))), [[0, 1], [1, 0]])


def test_bad_shapes_are_one_line_errors():
    with pytest.raises(HyperProveError, match="fact passages"):
        Hypergraph(incidence([[0]], 1), np.array([0, 0]), 1)
    with pytest.raises(HyperProveError, match="passage ids"):
        Hypergraph(incidence([[0]], 1), np.array([3]), 1)
