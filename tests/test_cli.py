"""The command line: one-line errors on bad input, and a smoke run with the real embedder."""

import json

import pytest

from pipeline.cli import main

CORPUS = [
    {"title": "Jaws (film)", "text": "Jaws is a 1975 thriller film directed by Steven Spielberg."},
    {"title": "Steven Spielberg", "text": "Steven Spielberg is an American film director. His mother was Leah Adler."},
    {"title": "Leah Adler", "text": "Leah Adler was an American restaurateur. She died in Los Angeles in 2017."},
    {"title": "Cincinnati", "text": "Cincinnati is a city in Ohio on the Ohio River."},
    {"title": "Ohio River", "text": "The Ohio River is a tributary of the Mississippi River."},
]
QUESTIONS = [{
    "id": "q1", "question": "When did the mother of the director of Jaws die?", "answer": "2017",
    "gold_passages": [0, 1, 2],
    "decomposition": [
        {"question": "Who directed Jaws?", "answer": "Steven Spielberg", "passage": 0},
        {"question": "Who was the mother of #1?", "answer": "Leah Adler", "passage": 1},
        {"question": "When did #2 die?", "answer": "2017", "passage": 2},
    ],
}]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS))
    return tmp_path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_bad_corpus_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps([{"title": "x"}]))
    code, out, err = run(capsys, "index", tmp_path / "bad.json", "--out", tmp_path / "idx")
    assert code == 2
    assert err.strip() == f'error: {tmp_path / "bad.json"}: item 0: field "text" is missing'
    assert not (tmp_path / "idx").exists()


def test_bad_index_and_retriever_and_config(files, capsys):
    code, _, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "dense", "--index", files / "nowhere")
    assert code == 2 and "no such index directory" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json", "--retriever", "ppr")
    assert code == 2 and "--retriever 'ppr'" in err
    (files / "cfg.json").write_text(json.dumps({"retriever": {"alpha": 7}}))
    code, _, err = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                       "--retriever", "hyperprove", "--config", files / "cfg.json")
    assert code == 2 and "alpha=7 is out of range" in err


@pytest.mark.slow
def test_index_then_evaluate_with_the_packaged_embedder(files, capsys):
    code, out, _ = run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--cache-dir", files / "cache", "--json")
    assert code == 0
    assert json.loads(out.strip().splitlines()[-1])["passages"] == 5
    results = {}
    for name in ("dense", "dense-iterative", "hyperprove"):
        code, out, _ = run(capsys, "evaluate", "--questions", files / "questions.json", "--corpus", files / "corpus.json",
                           "--index", files / "idx", "--retriever", name, "--top-k", 1, "--cache-dir", files / "cache", "--json")
        assert code == 0
        results[name] = json.loads(out.strip().splitlines()[-1])
        assert {"retriever", "n", "recall@2", "recall@5"} <= set(results[name])
    assert results["dense-iterative"]["recall@5"] == 100.0
    assert results["hyperprove"]["recall@5"] == 100.0
    assert results["hyperprove"]["config"]["top_k"] == 1
