"""Loaders: the project schema, HippoRAG's native files, and one-line errors for bad input."""

import json

import pytest

from experiments.data import GoldHop, load_questions
from modules.errors import HyperProveError
from modules.facts import Passage
from pipeline.index.corpus import load_corpus


def write(tmp_path, name, value):
    path = tmp_path / name
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


CORPUS = [{"title": "A", "text": "Alpha is first."}, {"title": "B", "text": "Beta is second. It follows."}]


def test_corpus_and_schema_questions(tmp_path):
    corpus = load_corpus(write(tmp_path, "c.json", CORPUS))
    assert corpus == [Passage("A", "Alpha is first."), Passage("B", "Beta is second. It follows.")]
    questions = load_questions(write(tmp_path, "q.json", [{
        "id": "q1", "question": "What follows #1?", "answer": "Beta", "answer_aliases": ["B"], "type": "2hop",
        "gold_passages": [0, 1], "decomposition": [{"question": "What is first?", "answer": "Alpha", "passage": 0}],
    }]), corpus)
    assert questions[0].gold_passages == (0, 1) and questions[0].answer_aliases == ("B",)
    assert questions[0].decomposition == (GoldHop("What is first?", "Alpha", 0),)


def test_hipporag_native_musique_and_2wiki(tmp_path):
    corpus = load_corpus(write(tmp_path, "c.json", CORPUS))
    musique = load_questions(write(tmp_path, "m.json", [{
        "id": "m1", "question": "Q?", "answer": "Beta", "answer_aliases": [],
        "paragraphs": [{"idx": 0, "title": "B", "paragraph_text": "Beta is second.  It follows.", "is_supporting": True},
                       {"idx": 1, "title": "A", "paragraph_text": "Alpha is first.", "is_supporting": False}],
        "question_decomposition": [{"question": "Q1?", "answer": "Beta", "paragraph_support_idx": 0}],
    }]), corpus)
    assert musique[0].gold_passages == (1,) and musique[0].decomposition[0].question == "Q1?"
    wiki = load_questions(write(tmp_path, "w.json", [{
        "_id": "w1", "question": "Q?", "answer": "Alpha",
        "context": [["A", ["Alpha is first."]], ["B", ["Beta is second.", " It follows."]]],
        "supporting_facts": [["B", 0], ["A", 0], ["B", 1]],
    }]), corpus)
    assert wiki[0].id == "w1" and wiki[0].gold_passages == (1, 0)


@pytest.mark.parametrize("content, message", [
    ("[{]", r"c.json: not valid JSON"),
    ({"title": "A"}, r"c.json: a corpus file holds a JSON list, found dict"),
    ([{"title": "A"}], r'c.json: item 0: field "text" is missing'),
    ([{"title": "A", "text": 3}], r'c.json: item 0: field "text" must be str, found int'),
    (["x"], r"c.json: item 0 is not a JSON object"),
    ([], r"c.json: the corpus is empty"),
])
def test_bad_corpus(tmp_path, content, message):
    with pytest.raises(HyperProveError, match=message):
        load_corpus(write(tmp_path, "c.json", content))


@pytest.mark.parametrize("item, message", [
    ({"id": "1", "answer": "x"}, r'q.json: item 0: field "question" is missing'),
    ({"id": "1", "question": "?", "answer": "x", "gold_passages": [7]}, r'field "gold_passages" holds 7, not a corpus index'),
    ({"id": "1", "question": "?", "answer": "x", "decomposition": [{"answer": "a"}]}, r'item 0 decomposition\[0\]: field "question" is missing'),
    ({"id": "1", "question": "?", "answer": 5}, r'field "answer" must be str or list'),
])
def test_bad_questions(tmp_path, item, message):
    corpus = load_corpus(write(tmp_path, "c.json", CORPUS))
    with pytest.raises(HyperProveError, match=message):
        load_questions(write(tmp_path, "q.json", [item]), corpus)


def test_missing_file_and_unknown_native_passage(tmp_path):
    with pytest.raises(HyperProveError, match="nope.json: questions file not found"):
        load_questions(tmp_path / "nope.json")
    corpus = load_corpus(write(tmp_path, "c.json", CORPUS))
    path = write(tmp_path, "w.json", [{"_id": "w", "question": "?", "answer": "a", "context": [["Z", ["Zed."]]], "supporting_facts": [["Z", 0]]}])
    with pytest.raises(HyperProveError, match='supporting passage "Z" is not in the corpus'):
        load_questions(path, corpus)
