"""The gold-decomposition driver and the dense baselines on a toy corpus."""

import pytest

from experiments.data import GoldHop, Question
from experiments.gold import DensePassageSearch, evaluate_ranker, gold_sub_queries, hyperprove_chain
from modules.errors import HyperProveError
from modules.facts import Passage
from modules.lm.references import fill_references
from modules.retrieval.retriever import RetrieverConfig, interleave_passages
from pipeline.config import IndexConfig
from pipeline.index.build import build_index

CORPUS = [
    Passage("Jaws (film)", "Jaws is a thriller film directed by Steven Spielberg."),
    Passage("Steven Spielberg", "Steven Spielberg is a film director. His mother was Leah Adler."),
    Passage("Leah Adler", "Leah Adler was a restaurateur. She died in Los Angeles in 2017."),
    Passage("Cincinnati", "Cincinnati is a city in Ohio on the river."),
]
QUESTION = Question(
    id="q", question="When did the mother of the director of Jaws die?", answer="2017", gold_passages=(0, 1, 2),
    decomposition=(GoldHop("Who directed Jaws?", "Steven Spielberg", 0), GoldHop("Who was the mother of #1?", "Leah Adler", 1),
                   GoldHop("When did #2 die?", "2017", 2)),
)


def test_fill_references():
    assert fill_references("When did #2 die, after #1?", ["A", "B"]) == "When did B die, after A?"
    assert fill_references("What about #3?", ["A"]) == "What about #3?"
    assert gold_sub_queries(QUESTION)[2] == "When did Leah Adler die?"


def test_no_decomposition_is_an_error():
    with pytest.raises(HyperProveError, match="no gold decomposition"):
        gold_sub_queries(Question(id="x", question="?", answer="a"))


def test_dense_iterative_and_hyperprove_find_the_chain(hash_embedder):
    index = build_index(CORPUS, IndexConfig(), hash_embedder, progress=False)
    search = DensePassageSearch(index.passage_index, hash_embedder.encode_query)
    summary, rows = evaluate_ranker([QUESTION], lambda q: (interleave_passages([search(s) for s in gold_sub_queries(q)]), []))
    assert rows[0]["passages"][:3] == [0, 1, 2] and summary["recall@5"] == 100.0
    retriever = index.retriever(RetrieverConfig(top_k=1, n_seeds=2), hash_embedder.encode_query)
    passages, traces = hyperprove_chain(QUESTION, retriever)
    assert set(passages[:5]) >= {0, 1, 2}
    assert traces[1]["frontier_in"] == [traces[0]["facts"][0]["id"]]  # hop 2 starts from hop 1's fact
    assert [t["facts"][0]["title"] for t in traces] == ["Jaws (film)", "Steven Spielberg", "Leah Adler"]
