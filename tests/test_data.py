"""Loaders: the project schema, HippoRAG's native files, and one-line errors for bad input."""

import json

import pytest

from experiments.data import Evidence, GoldHop, load_questions, quoted_passages, unfound_quotes
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


QUOTED = [
    Passage("Cargo › Summary", "Several table and key names in Cargo.toml have been removed.", "cargo.html#0"),
    Passage("Prelude › Details", "The prelude is the module containing everything that is automatically imported in every module. It contains commonly",
            "docs/prelude.html#0"),
    Passage("Prelude › Details", "It contains commonly used items such as Option, Vec, drop, and Clone.", "docs/prelude.html#1"),
    Passage("Elsewhere", "Several table and key names in Cargo.toml have been removed.", "other.html#0"),
]


def test_a_quote_finds_the_passages_of_its_file_that_hold_it_spaces_ignored():
    assert quoted_passages("Several table and  key names\nin Cargo.toml", "cargo.html", QUOTED) == (0,)  # not other.html's copy
    # a heading the reader moved into the title: 89 letters without spaces, of which the passage holds the last 50 (>= 45)
    assert quoted_passages("Cargo: Table and key name consistency Summary Several table and key names in Cargo.toml have been removed",
                           "cargo.html", QUOTED) == (0,)
    # cut by a passage boundary: 74 letters; the first holds the first 53, the second the last 39 (both >= 37);
    # the folder was read from above the one the quote names ("docs/")
    assert quoted_passages("automatically imported in every module. It contains commonly used items such as Option", "prelude.html", QUOTED) == (1, 2)
    assert quoted_passages("used items such as Option, Vec, drop", "prelude.html", QUOTED) == (2,)
    assert quoted_passages("1.85.0", "cargo.html", QUOTED) == ()  # a table cell the reader dropped
    assert quoted_passages("Several table and key names", "gone.html", QUOTED) == (0, 3)  # no passage of that file: all are searched


def test_evidence_quotes_give_the_gold_passages(tmp_path):
    items = [{"id": "b", "question": "Which items does the prelude hold?", "answer": "Option", "evidence": [
        {"file": "cargo.html", "quote": "key names in Cargo.toml"}, {"file": "prelude.html", "quote": "such as Option, Vec"},
        {"file": "index.html", "quote": "1.85.0"}]},
        {"id": "g", "question": "?", "answer": "x", "gold_passages": [3], "evidence": [{"file": "cargo.html", "quote": "Several"}]}]
    quoted, given = load_questions(write(tmp_path, "q.json", items), QUOTED)
    assert quoted.gold_passages == (0, 2) and quoted.evidence[1] == Evidence("prelude.html", "such as Option, Vec", (2,))
    assert given.gold_passages == (3,)  # ids given win over quotes
    assert unfound_quotes([quoted, given]) == ["b: '1.85.0' (index.html)"]
    for evidence, message in [([{"file": "a.html"}], r'item 0 evidence\[0\]: field "quote" is missing'),
                              (["text"], r'item 0 evidence\[0\] must be \{"file": ..., "quote": ...\}'),
                              ([{"file": "a.html", "quote": " "}], r'item 0 evidence\[0\]: field "quote" is empty')]:
        with pytest.raises(HyperProveError, match=message):
            load_questions(write(tmp_path, "bad.json", [{**items[0], "evidence": evidence}]), QUOTED)
    with pytest.raises(HyperProveError, match='q.json: item 0: field "evidence" gives quotes; they need the corpus to find their passages'):
        load_questions(tmp_path / "q.json")
    # a reader of types and answers with no corpus at hand (the report) keeps the quotes unlocated
    unlocated, _ = load_questions(tmp_path / "q.json", locate_quotes=False)
    assert (unlocated.type, unlocated.answer, unlocated.gold_passages) == ("", "Option", ())
    assert unlocated.evidence[1] == Evidence("prelude.html", "such as Option, Vec", ())
    # 2Wiki's evidence is triples, which its decomposition holds: no quotes, with or without the corpus
    triples = [{"id": "w", "question": "?", "answer": "x", "gold_passages": [1], "evidence": [["Jaws", "director", "Steven Spielberg"]]}]
    (wiki,) = load_questions(write(tmp_path, "w.json", triples))
    assert (wiki.gold_passages, wiki.evidence) == ((1,), ())
