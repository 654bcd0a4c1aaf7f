"""HypergraphRetriever on the hand-worked graph (conftest): every number below is derived there.

Hop 1, query q1, one dense seed (fact 0, cos 0.9), subgraph {0, 1, 2, 3} (fact 4 is three walk
steps away). T* over it: row 0 = [0, 5/7, 2/7, 0], row 1 = [1/2, 0, 1/5, 3/10],
row 2 = [1/2, 1/2, 0, 0], row 3 = [0, 1, 0, 0].
"""

import numpy as np
import pytest

from modules.errors import HyperProveError
from modules.retrieval.retriever import RetrieverConfig, interleave_passages, unique_in_order
from tests.conftest import QUERIES


def ids(prediction):
    return [f.id for f in prediction.facts]


def test_first_hop_scores_by_hand(make_retriever):
    # theta 0.25 keeps 0->1, 0->2, 1->0, 1->3, 2->0, 2->1, 3->1 (1->2 = 0.2 is cut).
    # struct = 1/max(d,1) of the distance to the dense seed {0}: 0: 1, 1: 1, 2: 1, 3 (3->1->0): 1/2.
    hop = make_retriever(alpha=0.5, theta=0.25, depth=2, top_k=2)("q1")
    scores = {f.id: f.score for f in hop.facts}
    assert ids(hop) == [0, 2]
    assert scores[0] == pytest.approx(0.5 * 0.9 + 0.5 * 1.0)
    assert scores[2] == pytest.approx(0.5 * 0.5 + 0.5 * 1.0)
    assert hop.ranked_ids.tolist() == [0, 2, 1, 3]  # 0.95, 0.75, 0.55, 0.35
    assert hop.frontier == [0, 2]
    assert hop.trace["subgraph_size"] == 4 and hop.trace["dense_seeds"] == [0]


def test_facts_naming_an_entity_the_query_names_get_the_entity_weight(make_retriever):
    # The first hop above (0.95, 0.75, 0.55, 0.35 for facts 0, 2, 1, 3); q1 names entity b, which
    # facts 1 and 3 name: beta 0.25 lifts them to 0.80 and 0.60, past fact 2 (0.75) for fact 1.
    names_b = {"q1": [1]}.get
    hop = make_retriever(names_b, alpha=0.5, theta=0.25, depth=2, top_k=2, entity_weight=0.25)("q1")
    assert hop.ranked_ids.tolist() == [0, 1, 2, 3]
    assert [f.score for f in hop.facts] == pytest.approx([0.95, 0.80])
    assert hop.frontier == [0, 1] and hop.trace["named_entities"] == [1]
    # beta 0.5: 1.05 and 0.85 put both above fact 0 (0.95)
    assert make_retriever(names_b, alpha=0.5, theta=0.25, depth=2, top_k=2, entity_weight=0.5)("q1").ranked_ids.tolist() == [1, 0, 3, 2]
    # beta 0, or no entity named, or no namer: the paper's score
    for retriever in (make_retriever(names_b, alpha=0.5, theta=0.25, entity_weight=0.0),
                      make_retriever(lambda query: [], alpha=0.5, theta=0.25, entity_weight=0.25),
                      make_retriever(None, alpha=0.5, theta=0.25, entity_weight=0.25)):
        hop = retriever("q1")
        assert hop.ranked_ids.tolist() == [0, 2, 1, 3] and hop.trace["named_entities"] == []


def test_alpha_one_ranks_by_cosine_only(make_retriever):
    hop = make_retriever(alpha=1.0, theta=0.25, depth=2, top_k=4)("q1")
    assert hop.ranked_ids.tolist() == [0, 2, 3, 1]
    assert [f.struct for f in hop.facts] == pytest.approx([1, 1, 0.5, 1])


def test_theta_cuts_transitions(make_retriever):
    # theta 0.4 keeps 0->1, 1->0, 2->0, 2->1, 3->1: from 0 only 1 is reachable.
    hop = make_retriever(alpha=0.5, theta=0.4, depth=4, top_k=5)("q1")
    assert hop.ranked_ids.tolist() == [0, 1]


def test_depth_bounds_the_search(make_retriever):
    # theta 0.25: 1 and 2 are one step from 0, fact 3 two steps.
    assert sorted(make_retriever(theta=0.25, depth=1, top_k=5)("q1").ranked_ids.tolist()) == [0, 1, 2]
    assert sorted(make_retriever(theta=0.25, depth=2, top_k=5)("q1").ranked_ids.tolist()) == [0, 1, 2, 3]
    assert make_retriever(theta=0.25, depth=0, top_k=5)("q1").ranked_ids.tolist() == [0]


def test_top_k_sets_how_many_facts_join_the_frontier(make_retriever):
    for k in (1, 2, 3):
        hop = make_retriever(alpha=0.5, theta=0.25, top_k=k)("q1")
        assert hop.frontier == [0, 2, 1][:k]


def test_subgraph_bound_limits_candidates(make_retriever):
    # bound 2 keeps the seed and the most visited fact (1): candidates {0, 1}.
    hop = make_retriever(theta=0.0, depth=3, top_k=5, subgraph_bound=2)("q1")
    assert sorted(hop.ranked_ids.tolist()) == [0, 1]
    assert hop.trace["subgraph_size"] == 2


def test_carried_frontier_changes_the_second_hop(make_retriever):
    # Hop 2, query q2 (dense seed: fact 4), frontier {0, 2}. Candidates {1, 3, 4};
    # distance to the frontier over theta 0.25: 1->0 = 1, 3->1->0 = 2, 4->3->1->0 = 3.
    # scores 0.5*cos + 0.5/d: 4: 0.45 + 1/6, 1: 0.05 + 0.5, 3: 0.15 + 0.25 -> 4, 1, 3.
    retriever = make_retriever(alpha=0.5, theta=0.25, depth=2, top_k=2)
    hop = retriever("q2", frontier=[0, 2])
    assert hop.ranked_ids.tolist() == [4, 1, 3]
    assert hop.frontier == [0, 2, 4, 1]
    assert {f.id: f.struct for f in hop.facts} == pytest.approx({4: 1 / 3, 1: 1.0})
    assert hop.passages == [1, 0]
    # Without the frontier: subgraph {1, 3, 4}, struct to the seed {4}: 4: 1, 3: 1, 1: 1/2
    # -> 4 (0.95), 3 (0.65), 1 (0.3).
    alone = retriever("q2")
    assert alone.ranked_ids.tolist() == [4, 3, 1]
    assert alone.frontier == [4, 3]


def test_frontier_facts_are_kept_not_reranked(make_retriever):
    hop = make_retriever(alpha=0.5, theta=0.0, depth=3, top_k=6)("q1", frontier=[2])
    assert 2 not in hop.ranked_ids.tolist()
    assert hop.frontier[0] == 2


def test_deterministic(make_retriever):
    retriever = make_retriever(alpha=0.7, theta=0.1, depth=2, top_k=3)
    first = retriever("q2", frontier=[0])
    for _ in range(3):
        again = retriever("q2", frontier=[0])
        assert again.ranked_ids.tolist() == first.ranked_ids.tolist()
        assert again.trace == first.trace


@pytest.mark.parametrize("field, value", [("alpha", 1.5), ("theta", -0.1), ("depth", -1), ("top_k", 0), ("subgraph_bound", 0)])
def test_config_out_of_range_is_an_error(field, value):
    with pytest.raises(HyperProveError, match=field):
        RetrieverConfig(**{field: value})


def test_config_unknown_field_is_an_error():
    with pytest.raises(HyperProveError, match="unknown field 'beta'"):
        RetrieverConfig.from_dict({"beta": 1})


def test_interleave_passages():
    assert interleave_passages([[1, 2, 3], [4, 1, 5]]) == [1, 4, 2, 3, 5]
    assert interleave_passages([[1, 2, 3], [4, 1, 5]], limit=3) == [1, 4, 2]
    assert interleave_passages([]) == []
    assert unique_in_order(np.array([3, 1, 3, 2, 1])) == [3, 1, 2]


def test_frontier_outside_the_graph_is_an_error(make_retriever):
    with pytest.raises(HyperProveError, match=r"frontier: fact ids must lie in \[0, 6\)"):
        make_retriever()("q1", frontier=[9])


def test_entity_facts_add_the_nearest_facts_naming_a_query_entity_wherever_they_lie(make_retriever):
    # Fact 5 (entity d, passage 2) lies outside the subgraph of q1; with entity_facts 1 a query
    # naming d gets it after the top 2 (0.95, 0.75), scored 0.5 * 0.25 + 0 (struct 0, beta 0).
    hop = make_retriever({"q1": [3]}.get, alpha=0.5, theta=0.25, depth=2, top_k=2, entity_weight=0.0, entity_facts=1)("q1")
    assert ids(hop) == [0, 2, 5] and hop.facts[2].score == pytest.approx(0.125) and hop.facts[2].struct == 0.0
    assert hop.ranked_ids.tolist() == [0, 2, 5, 1, 3] and hop.passages == [0, 2, 1] and hop.frontier == [0, 2, 5]
    # entity b names facts 1 (cos 0.1) and 3 (cos 0.2): the nearer, 3, moves up to right after the top 2
    hop = make_retriever({"q1": [1]}.get, alpha=0.5, theta=0.25, depth=2, top_k=2, entity_weight=0.0, entity_facts=1)("q1")
    assert ids(hop) == [0, 2, 3] and hop.ranked_ids.tolist() == [0, 2, 3, 1]
    # with the bonus, fact 1 is in the top 2 already; 3 follows at 0.5 * 0.2 + 0.25
    hop = make_retriever({"q1": [1]}.get, alpha=0.5, theta=0.25, depth=2, top_k=2, entity_weight=0.25, entity_facts=2)("q1")
    assert ids(hop) == [0, 1, 3] and hop.facts[2].score == pytest.approx(0.35) and hop.ranked_ids.tolist() == [0, 1, 3, 2]
    # no entity named, or none configured: the top K alone
    assert ids(make_retriever(lambda query: [], alpha=0.5, theta=0.25, top_k=2, entity_facts=2)("q1")) == [0, 2]
    assert ids(make_retriever({"q1": [3]}.get, alpha=0.5, theta=0.25, top_k=2)("q1")) == [0, 2]


def test_passage_facts_are_the_rest_of_a_passage_in_its_order(make_retriever):
    retriever = make_retriever(alpha=0.5)
    # passage 0 holds facts 0, 1, 2 (cos with q1: 0.9, 0.1, 0.5); fact 1 excluded; scored alpha * cos
    facts = retriever.passage_facts(0, QUERIES["q1"], exclude=[1])
    assert [(f.id, f.passage, f.title, f.struct) for f in facts] == [(0, 0, "P0", 0.0), (2, 0, "P0", 0.0)]
    assert [f.score for f in facts] == pytest.approx([0.45, 0.25]) and [f.cos for f in facts] == pytest.approx([0.9, 0.5])
    assert [f.id for f in retriever.passage_facts(0, QUERIES["q1"], n=2)] == [0, 1]
    assert [f.id for f in retriever.passage_facts(2, QUERIES["q1"])] == [5] and retriever.passage_facts(2, QUERIES["q1"], exclude=[5]) == []
    # a hop hands over its query vector, for the program to ask for its top passage's other facts
    hop = retriever("q1")
    assert hop.query_vector.tolist() == QUERIES["q1"].tolist()


# BM25 of the six facts for q1: fact 5 (alone in passage 2, cos 0.25, no edge to the rest) matches best, fact 3 next.
Q1_BM25 = {"q1": np.array([0.0, 0.0, 0.0, 1.0, 0.0, 2.0], dtype=np.float32)}.__getitem__


def test_lexical_seeds_enter_the_search_where_the_dense_seeds_do_not_reach(make_retriever):
    # Fact 5 joins seed 0: the walk from it finds only itself, so the rest of the subgraph and its
    # distances are the first hop's; fact 5 is an entry fact (distance 0, struct 1): 0.5 * 0.25 + 0.5 = 0.625,
    # between fact 2 (0.75) and fact 1 (0.55).
    hop = make_retriever(lexical=Q1_BM25, alpha=0.5, theta=0.25, depth=2, top_k=3, lexical_seeds=1)("q1")
    assert hop.ranked_ids.tolist() == [0, 2, 5, 1, 3]
    assert [f.score for f in hop.facts] == pytest.approx([0.95, 0.75, 0.625])
    assert hop.trace["lexical_seeds"] == [5] and hop.trace["dense_seeds"] == [0]
    # two lexical seeds, best first: 5 then 3. Fact 3 is now an entry fact (struct 1: 0.5 * 0.2 + 0.5 = 0.6), and the walk
    # from it reaches fact 4 (passage 1 and entity c, its only other fact: T*[4, 3] = 1), one step from an entry fact:
    # 0.5 * 0.3 + 0.5 = 0.65
    hop = make_retriever(lexical=Q1_BM25, alpha=0.5, theta=0.25, depth=2, top_k=3, lexical_seeds=2)("q1")
    assert hop.trace["lexical_seeds"] == [5, 3] and hop.ranked_ids.tolist() == [0, 2, 4, 5, 3, 1]
    assert [f.score for f in hop.facts] == pytest.approx([0.95, 0.75, 0.65])
    # without the option the scores are never asked for: the paper's hop
    asked = []
    hop = make_retriever(lexical=lambda query: asked.append(query), alpha=0.5, theta=0.25, depth=2, top_k=3)("q1")
    assert hop.ranked_ids.tolist() == [0, 2, 1, 3] and asked == [] and hop.trace["lexical_seeds"] == []


def test_lexical_weight_adds_a_share_of_the_best_facts_bm25(make_retriever):
    # the first hop's 0.95, 0.75, 0.55, 0.35 (facts 0, 2, 1, 3); fact 3 has BM25 1.0 of the best 2.0 (fact 5, not a
    # candidate): weight 0.5 adds 0.25 to it, 0.60, past fact 1 (0.55)
    hop = make_retriever(lexical=Q1_BM25, alpha=0.5, theta=0.25, depth=2, top_k=4, lexical_weight=0.5)("q1")
    assert hop.ranked_ids.tolist() == [0, 2, 3, 1]
    assert [f.score for f in hop.facts] == pytest.approx([0.95, 0.75, 0.60, 0.55])
    # a query no fact shares a word with: no change
    hop = make_retriever(lexical=lambda query: np.zeros(6), alpha=0.5, theta=0.25, depth=2, top_k=4, lexical_weight=0.5)("q1")
    assert hop.ranked_ids.tolist() == [0, 2, 1, 3]


def test_the_lexical_options_without_scores_are_an_error(make_retriever):
    with pytest.raises(HyperProveError, match="lexical_seeds and lexical_weight need the facts' BM25 scores"):
        make_retriever(alpha=0.5, lexical_seeds=2)("q1")


def test_lexical_index_scores_are_lucene_bm25():
    from modules.retrieval.lexical import LexicalIndex

    texts = ["CARGO_BUILD_JOBS sets jobs", "jobs jobs run", "Nothing shared here today"]
    scores = LexicalIndex(texts).scores("Which variable is CARGO_BUILD_JOBS?")
    # by hand, Lucene's BM25 (k1 1.5, b 0.75; idf ln(1 + (N - df + 0.5) / (df + 0.5)), tf part tf / (tf + k1 (1 - b + b dl / avgdl))):
    # "which" and "is" are stopwords; words per fact 3, 3, 4 ("cargo_build_jobs" is one word), avgdl 10/3;
    # "cargo_build_jobs" is in 1 of 3 facts, once in a 3-word fact
    idf = np.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    tf = 1 / (1 + 1.5 * (1 - 0.75 + 0.75 * 3 / (10 / 3)))
    assert scores == pytest.approx([idf * tf, 0.0, 0.0], rel=1e-5)
    # "jobs": in 2 facts, twice in fact 1
    idf = np.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    expected = [idf * 1 / (1 + 1.5 * (0.25 + 0.75 * 3 / (10 / 3))), idf * 2 / (2 + 1.5 * (0.25 + 0.75 * 3 / (10 / 3))), 0.0]
    assert LexicalIndex(texts).scores("jobs") == pytest.approx(expected, rel=1e-5)
    assert LexicalIndex(texts).scores("the").tolist() == [0.0, 0.0, 0.0] and LexicalIndex([]).scores("jobs").shape == (0,)
