"""EM, F1 and Recall@k against values computed by hand."""

import pytest

from experiments.metrics import exact_match, f1_score, normalize_answer, recall_at_k


def test_normalisation():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"


def test_exact_match_over_aliases():
    assert exact_match("the Beatles", ["Beatles"]) == 1.0
    assert exact_match("Ringo", ["John", "ringo."]) == 1.0
    assert exact_match("Paul", ["John"]) == 0.0


def test_f1_by_hand():
    # prediction "new york city" vs "new york": common 2, precision 2/3, recall 1 -> 0.8
    assert f1_score("New York City", ["New York"]) == pytest.approx(0.8)
    assert f1_score("New York City", ["Boston", "york city"]) == pytest.approx(0.8)
    assert f1_score("", ["x"]) == 0.0


def test_recall_at_k():
    assert recall_at_k([5, 1, 9, 2], [1, 2], 2) == 0.5
    assert recall_at_k([5, 1, 9, 2], [1, 2], 5) == 1.0
    with pytest.raises(ValueError):
        recall_at_k([1], [], 2)


def test_mean_percent_rounds_to_two_places():
    from experiments.metrics import mean_percent

    assert mean_percent([{"r": 1.0}, {"r": 0.5}, {"r": 0.0}], "r") == 50.0
    assert mean_percent([{"r": 1.0}, {"r": 0.0}, {"r": 0.0}], "r") == 33.33


def test_questions_are_grouped_by_type_and_musique_shapes_by_hop_count():
    from experiments.metrics import per_type, question_type

    assert [question_type(t) for t in ("2hop", "3hop1", "4hop3", "compositional", "")] == ["2hop", "3hop", "4hop", "compositional", "untyped"]
    rows = [{"id": "a", "f1": 1.0, "recall@5": 0.5}, {"id": "b", "f1": 0.0, "recall@5": 1.0}, {"id": "c", "f1": 0.25},
            {"id": "d", "f1": 0.5, "recall@5": 0.0}]
    types = {"a": "3hop1", "b": "3hop2", "c": "2hop"}  # "d" has none
    assert per_type(rows, types) == {"2hop": {"n": 1, "f1": 25.0},  # no gold passages: no recall
                                     "3hop": {"n": 2, "f1": 50.0, "recall@5": 75.0},
                                     "untyped": {"n": 1, "f1": 50.0, "recall@5": 0.0}}
    assert per_type(rows, {}) == {}


def test_answering_without_the_final_reader_where_a_rule_says_so():
    from experiments.tools.skip_reader import RULES, rule_rows

    hop = lambda sub_question, answer: {"sub_question": sub_question, "answer": answer}  # noqa: E731
    rows = [
        # a chain: the last sub-question refers to #1, so its hop answer replaces the reader's
        {"id": "a", "answer": "Leah Adler", "chain": [hop("Who directed Jaws?", "Steven Spielberg"), hop("Who is the mother of #1?", "Leah Posner")]},
        # a comparison (no reference in the last hop): the reader's answer stays
        {"id": "b", "answer": "Jaws", "chain": [hop("When did Jaws come out?", "1975"), hop("When did Duel come out?", "1971")]},
        # one hop: the hop answer
        {"id": "c", "answer": "the director", "chain": [hop("Who directed Jaws?", "Steven Spielberg")]},
    ]
    golds = {"a": ["Leah Adler"], "b": ["Duel"], "c": ["Spielberg", "Steven Spielberg"]}
    # by hand: a "Leah Posner" vs "Leah Adler" shares 1 of 2 tokens each way -> F1 0.5; b "Jaws" vs "Duel" -> 0; c exact alias -> 1
    assert [row["f1"] for row in rule_rows(rows, golds, RULES["chain"])] == [0.5, 0.0, 1.0]
    assert [row["f1"] for row in rule_rows(rows, golds, RULES["one hop"])] == [1.0, 0.0, 1.0]
