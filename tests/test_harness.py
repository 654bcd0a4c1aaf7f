"""The harness's pieces: system lists, run order, the results table and files."""

import json

import pytest

from experiments.harness import SystemResult, parse_systems, results_table, run_order, write_results
from modules.errors import HyperProveError


def test_parse_systems_keeps_order_and_drops_repeats():
    assert parse_systems("ppr, dense,ppr,,hyperprove") == ["ppr", "dense", "hyperprove"]
    assert parse_systems(["bm25"]) == ["bm25"]
    with pytest.raises(HyperProveError, match="name at least one system"):
        parse_systems(" , ")
    with pytest.raises(HyperProveError, match="'colbert': choose from dense"):
        parse_systems("dense,colbert")


def test_with_the_lm_hyperprove_runs_before_dense_iterative():
    assert run_order(["dense-iterative", "ppr", "hyperprove"], "lm") == ["hyperprove", "dense-iterative", "ppr"]
    assert run_order(["dense-iterative", "hyperprove"], "gold") == ["dense-iterative", "hyperprove"]
    with pytest.raises(HyperProveError, match="list hyperprove too"):
        run_order(["dense-iterative"], "lm")


SUMMARIES = [
    {"system": "dense", "n": 60, "recall@2": 39.3055, "recall@5": 57.78, "seconds_per_question": 0.00412, "retrieval_ms_per_question": 4.12},
    {"system": "hyperprove", "n": 60, "recall@2": 51.25, "recall@5": 68.333, "em": 5.0, "f1": 14.17,
     "lm_calls_per_question": 5.45, "prompt_tokens_per_question": 4210.4, "completion_tokens_per_question": 151.6,
     "seconds_per_question": 32.61, "retrieval_ms_per_question": 21.04},
]


def test_results_table_marks_what_does_not_apply():
    lines = results_table(SUMMARIES).splitlines()
    assert lines[0] == "| system | n | R@2 | R@5 | EM | F1 | LM calls/q | prompt tok/q | gen tok/q | s/q | retrieval ms/q |"
    assert lines[2] == "| dense | 60 | 39.31 | 57.78 | – | – | – | – | – | 0.00412 | 4.1 |"
    assert lines[3] == "| hyperprove | 60 | 51.25 | 68.33 | 5.00 | 14.17 | 5.45 | 4210 | 152 | 32.61 | 21.0 |"
    assert results_table(SUMMARIES[:1]).splitlines()[2] == "| dense | 60 | 39.31 | 57.78 | 0.00412 | 4.1 |"


def test_a_run_whose_calls_were_partly_cached_says_how_many_beside_its_seconds():
    # 60 questions, 327 LM calls, 81 of them answered from the cache: 1.35 a question took no LM time
    cached = [{**SUMMARIES[0], "lm_cache_hits": 0}, {**SUMMARIES[1], "lm_cache_hits": 81}]
    lines = results_table(cached).splitlines()
    assert lines[0] == "| system | n | R@2 | R@5 | EM | F1 | LM calls/q | of them cached/q | prompt tok/q | gen tok/q | s/q | retrieval ms/q |"
    assert lines[3] == "| hyperprove | 60 | 51.25 | 68.33 | 5.00 | 14.17 | 5.45 | 1.35 | 4210 | 152 | 32.61 | 21.0 |"
    assert lines[2].startswith("| dense | 60 | 39.31 | 57.78 | – | – | – | 0.00 |")
    # none cached: no column
    assert results_table([{**s, "lm_cache_hits": 0} for s in SUMMARIES]) == results_table(SUMMARIES)


def test_write_results(tmp_path):
    results = {s["system"]: SystemResult(s["system"], s, [{"id": "q1", "passages": [3, 1]}]) for s in SUMMARIES}
    paths = write_results(tmp_path / "out", {"name": "musique-lm60", "description": "First 60."}, results)
    assert paths["table"].read_text().startswith("# musique-lm60\n\nFirst 60.\n\n| system |")
    recorded = json.loads(paths["results"].read_text())
    assert recorded["name"] == "musique-lm60" and list(recorded["systems"]) == ["dense", "hyperprove"]
    assert json.loads(paths["predictions"].read_text())["hyperprove"] == [{"id": "q1", "passages": [3, 1]}]
