"""The HyperProve program with a scripted LM: hop wiring, "#k" rewriting, frontier carry, fallbacks."""

import re

import dspy
import pytest
from dspy.utils import DummyLM

from experiments.data import Question
from experiments.qa import evaluate_program
from modules.facts import Passage, ScoredFact
from modules.retrieval.retriever import RetrieverConfig
from pipeline.config import IndexConfig, ProgramConfig
from pipeline.index.build import build_index
from pipeline.lm.profile import LMProfile
from pipeline.program import HyperProve

CORPUS = [
    Passage("Jaws (film)", "Jaws is a 1975 thriller film. Jaws was directed by Steven Spielberg."),
    Passage("Steven Spielberg", "Steven Spielberg is an American film director. Steven Spielberg's mother was Leah Adler."),
    Passage("Leah Adler", "Leah Adler was an American restaurateur. Leah Adler died in 2017."),
    Passage("Ohio River", "The Ohio River is a tributary of the Mississippi River."),
]
QUESTION = "When did the mother of the director of Jaws die?"
SUBS = ["Who directed Jaws?", "Who was the mother of #1?", "When did #2 die?"]
DECOMPOSE = "`[[ ## sub_questions ## ]]`"  # only the Decompose prompt asks for this field


def ask(text):  # the key that picks out the AnswerHop / GenerateAnswer prompt for one question
    return f"[[ ## question ## ]]\n{text}\n\n"


def script(**changes):
    """The answers of a well-behaved LM, keyed by what identifies each prompt; `changes` override."""
    answers = {
        DECOMPOSE: {"sub_questions": SUBS},
        "[[ ## sub_question ## ]]\nWho was the mother of #1?": {"question": "Who was the mother of Steven Spielberg?"},
        "[[ ## sub_question ## ]]\nWhen did #2 die?": {"question": "When did Leah Adler die?"},
        ask("Who directed Jaws?"): {"answer": "Steven Spielberg", "supporting": [1]},
        ask("Who was the mother of Steven Spielberg?"): {"answer": "Leah Adler", "supporting": [1]},
        ask("When did Leah Adler die?"): {"answer": "2017", "supporting": [1]},
        ask(QUESTION): {"answer": "2017"},
    }
    answers.update(changes)
    return answers


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    from tests.support import HashEmbedder

    embedder = HashEmbedder()
    index = build_index(CORPUS, IndexConfig(embedder=embedder.id), embedder, progress=False)
    return index.retriever(RetrieverConfig(top_k=2, n_seeds=3), embedder.encode_query)


def run(retriever, answers, **config):
    """The program on QUESTION with a scripted LM; bridges rewritten by the LM unless `config` says
    otherwise (the scripted rewrites are part of these tests; the default fills "#k" by rule)."""
    config.setdefault("bridge_rewrite", "lm")
    counter = LMProfile()
    lm = DummyLM(answers)
    lm.callbacks = [counter]
    with dspy.context(lm=lm):
        prediction = HyperProve(retriever, ProgramConfig(**config))(QUESTION)
    return prediction, counter.calls


def test_hops_are_wired_in_order_and_references_rewritten(retriever):
    prediction, calls = run(retriever, script())
    assert prediction.answer == "2017"
    assert prediction.fallbacks == []
    assert [hop["sub_question"] for hop in prediction.chain] == SUBS
    assert [hop["query"] for hop in prediction.chain] == ["Who directed Jaws?", "Who was the mother of Steven Spielberg?", "When did Leah Adler die?"]
    assert [hop["answer"] for hop in prediction.chain] == ["Steven Spielberg", "Leah Adler", "2017"]
    assert calls == 1 + 2 + 3 + 1  # decompose, two rewrites (hop 1 has no reference), three hop answers, final
    # by default "#k" is filled by rule: the same queries here, without the two rewrite calls
    by_rule, calls = run(retriever, script(), bridge_rewrite=ProgramConfig().bridge_rewrite)
    assert [hop["query"] for hop in by_rule.chain] == [hop["query"] for hop in prediction.chain] and calls == 1 + 3 + 1
    # Each hop's evidence is what the retriever returns for its query: the fact that answers it comes first.
    assert [hop["facts"][0]["text"] for hop in prediction.chain] == [
        "Jaws was directed by Steven Spielberg.", "Steven Spielberg's mother was Leah Adler.", "Leah Adler died in 2017.",
    ]


def test_the_frontier_carries_the_supporting_facts(retriever):
    prediction, _ = run(retriever, script())
    first, second, third = prediction.chain
    assert first["frontier_in"] == []
    assert first["supporting"] == [first["facts"][0]["id"]]  # the reader cited fact number 1
    assert second["frontier_in"] == first["supporting"]
    assert third["frontier_in"] == first["supporting"] + second["supporting"]
    assert prediction.frontier == first["supporting"] + second["supporting"] + third["supporting"]


def test_carry_top_k_carries_every_evidence_fact(retriever):
    prediction, _ = run(retriever, script(), carry="top_k")
    first, second, _ = prediction.chain
    assert second["frontier_in"] == [fact["id"] for fact in first["facts"]]
    assert len(second["frontier_in"]) == 2


def test_a_failed_decomposition_becomes_one_hop_on_the_question(retriever):
    prediction, calls = run(retriever, script(**{DECOMPOSE: {"sub_questions": ["When did #2 die?", "Who?"]}}))
    assert [hop["query"] for hop in prediction.chain] == [QUESTION]
    assert prediction.fallbacks[0].startswith("decompose: sub-question 1 refers to an answer not yet known")
    # too many hops for max_hops counts as failed too
    prediction, _ = run(retriever, script(), max_hops=2)
    assert len(prediction.chain) == 1 and "more than 2" in prediction.fallbacks[0]


def test_a_failed_rewrite_falls_back_to_substitution(retriever):
    answers = script(**{"[[ ## sub_question ## ]]\nWho was the mother of #1?": {"question": "Who was the mother?"}})
    prediction, _ = run(retriever, answers)
    assert prediction.chain[1]["query"] == "Who was the mother of Steven Spielberg?"
    assert prediction.fallbacks == ["rewrite 2: the rewrite 'Who was the mother?' drops the resolved answer 'Steven Spielberg'"]
    assert prediction.answer == "2017"


def test_bridges_by_rule_make_no_rewrite_call(retriever):
    # a script without the rewrite prompts: a rewrite call would get DummyLM's default answer
    answers = {k: v for k, v in script().items() if not k.startswith("[[ ## sub_question")}
    prediction, calls = run(retriever, answers, bridge_rewrite="rule")
    assert [hop["query"] for hop in prediction.chain] == ["Who directed Jaws?", "Who was the mother of Steven Spielberg?", "When did Leah Adler die?"]
    assert prediction.answer == "2017" and prediction.fallbacks == []
    assert calls == 1 + 3 + 1  # decompose, three hop answers, the final answer; the LM path makes 7


def test_a_failed_hop_answer_bridges_with_the_best_fact_and_carries_top_k(retriever):
    answers = script(**{ask("Who directed Jaws?"): {"answer": "", "supporting": []}})
    answers["[[ ## sub_question ## ]]\nWho was the mother of #1?"] = {"question": "Who was the mother of Jaws was directed by Steven Spielberg.?"}
    prediction, _ = run(retriever, answers)
    first, second, _ = prediction.chain
    assert first["answer"] == "Jaws was directed by Steven Spielberg."
    assert first["supporting"] == []
    assert second["frontier_in"] == [fact["id"] for fact in first["facts"]]
    assert prediction.fallbacks[0].startswith("answer 1: no answer")


def test_a_failed_final_answer_is_the_last_hop_answer(retriever):
    prediction, _ = run(retriever, script(**{ask(QUESTION): {"answer": ""}}))
    assert prediction.answer == "2017"
    assert prediction.fallbacks == [f"final answer: no final answer to {QUESTION!r}"]


def test_the_program_exposes_its_five_predictors_and_saves_them_as_json(retriever, tmp_path):
    program = HyperProve(retriever)
    assert [name for name, _ in program.named_predictors()] == ["decompose.decompose", "rewrite.rewrite", "answer_hop.answer", "generate.generate",
                                                                "generate.choose"]
    program.decompose.decompose.demos = program.decompose.decompose.demos[:1]
    program.save(tmp_path / "program.json")
    fresh = HyperProve(retriever)
    fresh.load(tmp_path / "program.json")
    assert len(fresh.decompose.decompose.demos) == 1
    assert fresh.decompose.decompose.demos[0]["question"] == program.decompose.decompose.demos[0].question


def test_one_failing_question_does_not_stop_a_batch():
    questions = [Question(id=str(k), question=f"q{k}", answer="yes", gold_passages=(0,)) for k in range(3)]

    def program(text):
        if text == "q1":
            raise ConnectionError("LM down")
        return dspy.Prediction(answer="yes", passages=[0, 1], chain=[], fallbacks=[])

    summary, rows = evaluate_program(questions, program)
    assert rows[1]["error"] == "ConnectionError: LM down" and rows[1]["em"] == 0.0
    assert summary["errors"] == 1
    assert summary["em"] == pytest.approx(200 / 3, abs=0.01)
    assert summary["recall@2"] == pytest.approx(200 / 3, abs=0.01)


def final_prompt(retriever, **config) -> tuple[dspy.Prediction, str]:
    """The prediction and the text of the last LM call: the final reader's prompt."""
    lm = DummyLM(script())
    with dspy.context(lm=lm):
        prediction = HyperProve(retriever, ProgramConfig(**config))(QUESTION)
    return prediction, lm.history[-1]["messages"][-1]["content"]


def test_the_final_reader_sees_what_reader_evidence_names(retriever):
    chain_line = "Who directed Jaws? -> Steven Spielberg"
    whole_passage = "(Leah Adler) Leah Adler was an American restaurateur. Leah Adler died in 2017."
    prediction, facts_prompt = final_prompt(retriever, reader_evidence="facts")
    assert chain_line in facts_prompt and "(Leah Adler) Leah Adler died in 2017." in facts_prompt and whole_passage not in facts_prompt
    prediction, passages_prompt = final_prompt(retriever, reader_evidence="passages")
    assert chain_line in passages_prompt and whole_passage in passages_prompt
    assert prediction.answer == "2017"
    _, alone = final_prompt(retriever, reader_evidence="passages-only")
    assert chain_line not in alone and whole_passage in alone
    # the passages are the program's first five, as every peer's reader gets its own
    titles = [CORPUS[p].title for p in prediction.passages[:5]]
    assert all(f"({title})" in alone for title in titles)


def test_the_question_channel_leads_the_interleaved_passages(retriever):
    from modules.retrieval.retriever import interleave_passages

    plain, _ = run(retriever, script(), question_channel=False)
    channel, calls = run(retriever, script(), question_channel=True)
    assert calls == 7  # no LM call more: the question's ranking is retrieval only
    hops = [retriever(hop["query"], frontier=hop["frontier_in"]).passages for hop in channel.chain]
    assert plain.passages == interleave_passages(hops)
    assert channel.passages == interleave_passages([retriever(QUESTION).passages, *hops])
    assert channel.answer == plain.answer and channel.chain == plain.chain


def test_checked_decomposition_and_grounded_hops_show_in_the_fallbacks(retriever):
    from modules.lm.checks import supported_span

    # the decomposer keeps dropping "Jaws"; the first hop's answer is in no fact: asked again, then replaced
    answers = script(**{DECOMPOSE: {"sub_questions": ["Who directed the film?"]},
                        ask("Who directed the film?"): {"answer": "George Lucas", "supporting": [1]}})
    lm = DummyLM(answers)
    with dspy.context(lm=lm):
        prediction = HyperProve(retriever, ProgramConfig(entity_retries=1, grounded_hops=True))(QUESTION)
    prompts = [call["messages"][-1]["content"] for call in lm.history]
    assert sum(DECOMPOSE in prompt for prompt in prompts) == 2
    assert sum(ask("Who directed the film?") in prompt for prompt in prompts) == 2
    hop = prediction.chain[0]
    cited = [ScoredFact(**hop["facts"][0])]
    assert hop["answer"] == supported_span(hop["query"], cited) and hop["supporting"] == [hop["facts"][0]["id"]]
    assert prediction.fallbacks[:2] == ["decompose: kept one that drops 'jaws' after 2 tries",
                                        f"answer 1: 'George Lucas' is not in the facts it cites; their span {hop['answer']!r} replaces it"]


def test_grounded_hops_keep_an_answer_whose_facts_hold_nothing_of_its_kind(retriever):
    # hop 1 cites "Jaws is a 1975 thriller film." for a "who": a year is no name, so nothing replaces it;
    # hop 3 cites "Leah Adler was an American restaurateur." for a "when": no date there either
    answers = script(**{ask("Who directed Jaws?"): {"answer": "Steven Spielberg", "supporting": [2]},
                        ask("When did Leah Adler die?"): {"answer": "2017", "supporting": [2]}})
    lm = DummyLM(answers)
    with dspy.context(lm=lm):
        prediction = HyperProve(retriever, ProgramConfig(grounded_hops=True))(QUESTION)
    prompts = [call["messages"][-1]["content"] for call in lm.history]
    assert sum(ask("Who directed Jaws?") in prompt for prompt in prompts) == 2  # asked again before it is kept
    assert [hop["answer"] for hop in prediction.chain] == ["Steven Spielberg", "Leah Adler", "2017"] and prediction.answer == "2017"
    assert prediction.fallbacks == ["answer 1: 'Steven Spielberg' is not in the facts it cites, and no name of theirs can replace it; kept",
                                    "answer 3: '2017' is not in the facts it cites, and no date of theirs can replace it; kept"]


def test_comparison_demos_reach_the_program_decomposer(retriever):
    assert len(HyperProve(retriever).decompose.decompose.demos) == 4  # on by default
    assert len(HyperProve(retriever, ProgramConfig(comparison_demos=False)).decompose.decompose.demos) == 2


def test_a_compiled_program_without_a_newer_predictor_loads_and_keeps_its_built_in_demos(retriever, tmp_path):
    import json

    from modules.errors import HyperProveError
    from pipeline.program import load_compiled

    program = HyperProve(retriever)
    program.decompose.decompose.demos = program.decompose.decompose.demos[:1]
    program.save(tmp_path / "program.json")
    state = json.loads((tmp_path / "program.json").read_text())
    del state["generate.choose"]  # as saved before the chooser existed
    (tmp_path / "old.json").write_text(json.dumps(state))
    loaded = load_compiled(HyperProve(retriever), str(tmp_path / "old.json"))
    assert len(loaded.decompose.decompose.demos) == 1 and len(loaded.generate.choose.demos) == 2
    (tmp_path / "other.json").write_text(json.dumps({"metadata": state["metadata"], "classify.predict": state["generate.generate"]}))
    with pytest.raises(HyperProveError, match="holds none of the predictors"):
        load_compiled(HyperProve(retriever), str(tmp_path / "other.json"))


CHOICE = "Who died first, Leah Adler or Steven Spielberg?"


@pytest.mark.parametrize("choose_options, answer", [(True, "Leah Adler"), (False, "2017")])
def test_choose_options_makes_the_final_answer_one_of_the_named_options(retriever, choose_options, answer):
    # the final reader answers with a date; with the check on, the chooser's reply replaces it
    answers = {"[[ ## options ## ]]": {"answer": "Leah Adler"}, **script(), ask(CHOICE): {"answer": "2017"}}
    lm = DummyLM(answers)
    with dspy.context(lm=lm):
        # the LM's own decomposition and reader: a comparison by rule would not ask the reader
        prediction = HyperProve(retriever, ProgramConfig(choose_options=choose_options, comparison_plans=False, compare_by_rule=False))(CHOICE)
    assert prediction.answer == answer and prediction.answer_before_choice == ("2017" if choose_options else None)
    notes = ["final answer: '2017' is none of the question's options; the reader chose 'Leah Adler'"] if choose_options else []
    assert [note for note in prediction.fallbacks if note.startswith("final answer")] == notes
    assert sum("[[ ## options ## ]]" in call["messages"][-1]["content"] for call in lm.history) == int(choose_options)


def test_the_answer_record_names_the_first_answer_only_when_the_reader_chose_another():
    from pipeline.serve.ask import answer_record

    chose = dspy.Prediction(answer="Leah Adler", answer_before_choice="2017", chain=[], fallbacks=["final answer: ..."])
    kept = dspy.Prediction(answer="2017", answer_before_choice=None, chain=[], fallbacks=[])
    assert answer_record("q", chose)["answer_before_choice"] == "2017"
    assert "answer_before_choice" not in answer_record("q", kept)


def test_the_first_answer_bench_shows_the_cited_facts_or_else_the_top_one_with_their_files():
    from experiments.bench.first_answer import evidence

    fact = lambda i, passage: {"id": i, "passage": passage, "title": f"T{passage}", "text": f"fact {i}"}  # noqa: E731
    record = {"chain": [{"hop": 1, "facts": [fact(4, 0), fact(7, 1)], "supporting": [7]}, {"hop": 2, "facts": [fact(9, 2), fact(3, 0)], "supporting": []}],
              "sources": [{"id": 1, "source": "std/vec.html#2"}, {"id": 2}]}
    assert evidence(record) == [{"hop": 1, "title": "T1", "text": "fact 7", "source": "std/vec.html#2"},
                                {"hop": 2, "title": "T2", "text": "fact 9", "source": None}]


def test_a_peer_reader_makes_the_same_choice():
    from experiments.qa import PassageReader

    lm = DummyLM({"[[ ## options ## ]]": {"answer": "Leah Adler"}, ask(CHOICE): {"answer": "2017"}})
    with dspy.context(lm=lm):
        prediction = PassageReader(lambda question: [2, 1, 0], CORPUS, k=2, choose=True)(CHOICE)
    assert prediction.answer == "Leah Adler" and prediction.passages == [2, 1, 0] and prediction.answer_before_choice == "2017"
    assert prediction.fallbacks == ["final answer: '2017' is none of the question's options; the reader chose 'Leah Adler'"]
    assert "(Leah Adler) Leah Adler was an American restaurateur." in lm.history[-1]["messages"][-1]["content"]


def comparison_run(retriever, second_death: str) -> tuple[dspy.Prediction, DummyLM]:
    subs = ["When did Leah Adler die?", "When did Steven Spielberg die?"]
    answers = {**script(), DECOMPOSE: {"sub_questions": subs}, ask(subs[0]): {"answer": "2017", "supporting": [1]},
               ask(subs[1]): {"answer": second_death, "supporting": [1]}, ask(CHOICE): {"answer": "Steven Spielberg"}}
    lm = DummyLM(answers)
    with dspy.context(lm=lm):
        prediction = HyperProve(retriever, ProgramConfig(compare_by_rule=True, comparison_plans=False, grounded_hops=False, entity_retries=0))(CHOICE)
    return prediction, lm


def test_compare_by_rule_answers_from_the_hop_answers_without_the_final_reader(retriever):
    prediction, lm = comparison_run(retriever, "March 2020")
    assert prediction.answer == "Leah Adler"  # 2017 before 2020: the reader, which would say Spielberg, is not asked
    assert prediction.by_rule == "Leah Adler (2017) < Steven Spielberg (2020-3), the lesser wins"
    assert len(lm.history) == 3 and prediction.fallbacks == []  # decompose and two hop answers
    from pipeline.serve.ask import format_chain
    assert format_chain(prediction)[-1] == "  answered by rule: Leah Adler (2017) < Steven Spielberg (2020-3), the lesser wins"


def test_compare_by_rule_leaves_an_unparsed_value_to_the_reader_and_says_so(retriever):
    prediction, lm = comparison_run(retriever, "unknown")
    assert prediction.answer == "Steven Spielberg" and prediction.by_rule is None
    assert prediction.fallbacks == ["compare: no date in 'unknown'; the reader answers"]
    assert len(lm.history) == 4


def test_comparison_plans_ask_by_rule_and_need_no_decomposer(retriever):
    answers = {**script(), DECOMPOSE: {"sub_questions": ["When did Leah Adler die?"]},
               ask("When did Leah Adler die?"): {"answer": "2017", "supporting": [1]},
               ask("When did Steven Spielberg die?"): {"answer": "2020", "supporting": [1]}}
    lm = DummyLM(answers)
    with dspy.context(lm=lm):
        prediction = HyperProve(retriever, ProgramConfig(comparison_plans=True, compare_by_rule=True, grounded_hops=False))(CHOICE)
    assert [hop["sub_question"] for hop in prediction.chain] == ["When did Leah Adler die?", "When did Steven Spielberg die?"]
    assert prediction.planned_by_rule and prediction.answer == "Leah Adler"
    assert len(lm.history) == 2  # the two hop answers: no decomposition, no final reader
    assert not any(DECOMPOSE in call["messages"][-1]["content"] for call in lm.history)


@pytest.mark.parametrize("both_by_rule, answer, calls", [(True, "no", 3), (False, "Yes", 4)])
def test_both_by_rule_answers_from_the_hops_yes_and_no(retriever, both_by_rule, answer, calls):
    question = "Are both Leah Adler and Steven Spielberg restaurateurs?"
    subs = ["Is Leah Adler a restaurateur?", "Is Steven Spielberg a restaurateur?"]
    answers = {**script(), DECOMPOSE: {"sub_questions": subs}, ask(subs[0]): {"answer": "Yes", "supporting": [1]},
               ask(subs[1]): {"answer": "No", "supporting": [1]}, ask(question): {"answer": "Yes"}}
    lm = DummyLM(answers)
    with dspy.context(lm=lm):
        prediction = HyperProve(retriever, ProgramConfig(both_by_rule=both_by_rule, grounded_hops=False, entity_retries=0))(question)
    assert prediction.answer == answer and len(lm.history) == calls  # the rule needs no final reader
    assert prediction.by_rule == ("both: the hops answered yes, no" if both_by_rule else None)


def test_an_evaluation_counts_the_questions_planned_and_answered_by_rule():
    from experiments.harness import results_table

    questions = [Question(id=str(k), question=f"q{k}", answer="yes", gold_passages=(0,)) for k in range(3)]
    ruled = {"q0": {"by_rule": "the last hop's answer, a name as the question asks"},
             "q1": {"by_rule": "A (1961) > B (1943), the lesser wins", "planned_by_rule": True, "documentation": True}}

    def program(text):
        return dspy.Prediction(answer="yes", passages=[0], chain=[], fallbacks=[], **ruled.get(text, {}))

    summary, rows = evaluate_program(questions, program)
    assert (summary["answered_by_rule"], summary["planned_by_rule"], summary["documentation_demos"]) == (2, 1, 1)
    assert [row.get("by_rule") for row in rows] == [ruled["q0"]["by_rule"], ruled["q1"]["by_rule"], None]
    assert [row.get("documentation_demos") for row in rows] == [None, True, None]
    assert results_table([{**summary, "system": "hyperprove"}]).splitlines()[0].endswith(
        "| planned by rule | answered by rule | documentation demos |")


def test_the_hop_reader_also_reads_the_rest_of_the_top_passage(retriever):
    """With hop_passage_facts, each hop's reader sees its top K facts, then the other facts of the
    hop's top passage in order; the frontier still carries only the facts it cites."""
    from modules.retrieval.retriever import HypergraphRetriever

    one = HypergraphRetriever(retriever.hypergraph, retriever.facts, retriever.encode, RetrieverConfig(top_k=1, n_seeds=3, lexical_seeds=0, lexical_weight=0.0),
                              retriever.name_entities)
    plain, _ = run(one, script(), hop_passage_facts=0)
    assert [[fact["text"] for fact in hop["facts"]] for hop in plain.chain] == [
        ["Jaws was directed by Steven Spielberg."], ["Steven Spielberg's mother was Leah Adler."], ["Leah Adler died in 2017."]]
    read, calls = run(one, script(), hop_passage_facts=3)
    assert [[fact["text"] for fact in hop["facts"]] for hop in read.chain] == [
        ["Jaws was directed by Steven Spielberg.", "Jaws is a 1975 thriller film."],
        ["Steven Spielberg's mother was Leah Adler.", "Steven Spielberg is an American film director."],
        ["Leah Adler died in 2017.", "Leah Adler was an American restaurateur."]]
    assert read.answer == "2017" and calls == 1 + 2 + 3 + 1
    assert [hop["supporting"] for hop in read.chain] == [hop["supporting"] for hop in plain.chain]
    assert read.frontier == plain.frontier


POOL = [  # the query "Who directed the film Jaws?" shares 4 of 5 words with the first, 3 of its 5 and 3 of these 3 with the second, none with the third
    {"question": "Who directed the film Duel?", "sub_questions": ["Who directed Duel?"]},
    {"question": "Who directed Jaws?", "sub_questions": ["Who directed Jaws?"]},
    {"question": "When was Leah Adler born?", "sub_questions": ["When was Leah Adler born?"]},
    {"question": "who directed the  film Jaws?", "sub_questions": ["the asked question itself"]},
]


def test_a_pooled_predictor_shows_the_nearest_gold_examples_and_never_the_question_itself():
    from modules.lm.pool import PooledPredict
    from modules.lm.signatures import Decompose
    from tests.support import HashEmbedder

    encode = HashEmbedder().encode_query
    predictor = PooledPredict(Decompose, demos=[])
    predictor.use_pool(POOL, per_call=2)
    # bag-of-words cosines: 4 / 5 = 0.8 for the first, 3 / sqrt(5 * 3) = 0.77 for the second, 0 for the third; the
    # fourth is the question itself (case and spaces aside): left out. The nearest comes last, next to the question.
    assert predictor.nearest("Who directed the film Jaws?", encode) == [POOL[1], POOL[0]]
    lm = DummyLM([{"sub_questions": ["Who directed Jaws?"]}] * 2)
    with dspy.context(lm=lm):
        predictor(question="Who directed the film Jaws?", encode=encode)
        predictor(question="Who directed the film Jaws?")  # no encoder: the fixed demos (none) alone
    shown, plain = (str(call["messages"]) for call in lm.history)
    assert shown.index("Who directed Jaws?") < shown.index("Who directed the film Duel?")
    assert "Leah Adler" not in shown and "the asked question itself" not in shown
    assert "Duel" not in plain


HOPS = [  # hop examples and the questions they were steps of; asked "When was the director of Jaws born?", the first two
    # questions share 6 of their 7 words with it (cosine 6/7), the third 2 of 7 (2/7), the fourth is the asked question itself
    {"question": "Who directed Duel?", "answer": "Steven Spielberg", "asked": "When was the director of Duel born?"},
    {"question": "When was Steven Spielberg born?", "answer": "1946", "asked": "When was the director of Duel born?"},
    {"question": "Where is Cleveland?", "answer": "Ohio", "asked": "In which state was Eric Carmen born?"},
    {"question": "Who directed Jaws?", "answer": "the asked question's own step", "asked": "when was the director of  Jaws born?"},
]


def test_a_pool_chosen_by_the_question_asked_shows_the_same_steps_on_every_hop_in_their_order():
    from modules.lm.pool import PooledPredict
    from tests.support import HashEmbedder

    encode, asked = HashEmbedder().encode_query, "When was the director of Jaws born?"
    hops = [{**hop, "evidence": [f"[1] {hop['answer']}"], "supporting": [1]} for hop in HOPS]
    predictor = PooledPredict("question, evidence -> answer, supporting: list[int]")
    with pytest.raises(ValueError, match="pool example 1 has no 'asked'"):
        predictor.use_pool([{key: value for key, value in hop.items() if key != "asked"} for hop in hops], per_call=3, by="question")
    predictor.use_pool(hops, per_call=3, by="question")
    shown = [{key: hop[key] for key in ("question", "evidence", "answer", "supporting")} for hop in hops]
    # the farthest first, the nearest last; the two steps of one question tie, and keep their order
    assert predictor.nearest(asked, encode) == [shown[2], shown[0], shown[1]]
    lm = DummyLM([{"answer": "Steven Spielberg", "supporting": [1]}, {"answer": "1946", "supporting": [1]}])
    with dspy.context(lm=lm):
        predictor(question="Who directed Jaws?", evidence=["[1] Jaws was directed by Steven Spielberg."], encode=encode, asked=asked)
        predictor(question="When was Steven Spielberg born?", evidence=["[1] Spielberg was born in 1946."], encode=encode, asked=asked)
    first, second = (call["messages"] for call in lm.history)
    assert first[:-1] == second[:-1] and first[-1] != second[-1]  # one prefix for both hops: a prompt cache keeps it
    assert "Where is Cleveland?" in str(first) and "own step" not in str(first) and "Duel born" not in str(first)


def test_a_pool_is_saved_with_the_program_and_checked_when_loaded(retriever, tmp_path):
    import json

    from modules.errors import HyperProveError
    from pipeline.program import load_compiled

    program = HyperProve(retriever)
    program.decompose.decompose.use_pool(POOL, per_call=3)
    hops = [{**hop, "evidence": [], "supporting": []} for hop in HOPS]
    program.answer_hop.answer.use_pool(hops, per_call=2, by="question")
    program.save(tmp_path / "program.json")
    loaded = load_compiled(HyperProve(retriever), str(tmp_path / "program.json"))
    assert (loaded.decompose.decompose.pool, loaded.decompose.decompose.per_call, loaded.decompose.decompose.by) == (POOL, 3, "call")
    assert (loaded.answer_hop.answer.pool, loaded.answer_hop.answer.by) == (hops, "question")
    assert HyperProve(retriever).answer_hop.answer.pool == [] and "pool" not in HyperProve(retriever).answer_hop.answer.dump_state()
    state = json.loads((tmp_path / "program.json").read_text())
    for change, problem in [
        ({"per_call": 17}, "decompose.decompose.per_call: must be a whole number from 0 to 16"),
        ({"per_call": "3"}, "decompose.decompose.per_call: must be a whole number from 0 to 16"),
        ({"pool": {"question": "x"}}, "decompose.decompose.pool: must be a list of objects of plain JSON values"),
        ({"pool": [{"question": "Who directed Duel?"}]}, "pool example 1 has no 'sub_questions'"),
        ({"by": "nearest"}, "decompose.decompose.by: must be one of call, question"),
        ({"by": "question"}, "pool example 1 has no 'asked'"),
    ]:
        (tmp_path / "bad.json").write_text(json.dumps({**state, "decompose.decompose": {**state["decompose.decompose"], **change}}))
        with pytest.raises(HyperProveError, match=re.escape(problem)):
            load_compiled(HyperProve(retriever), str(tmp_path / "bad.json"))


@pytest.mark.parametrize("n", [0, 2])
def test_the_decomposer_reads_the_top_facts_for_the_question_when_asked(retriever, n):
    from modules.lm.signatures import FACTS_NOTE

    lm = DummyLM(script())
    with dspy.context(lm=lm):
        prediction = HyperProve(retriever, ProgramConfig(decompose_facts=n, bridge_rewrite="lm"))(QUESTION)
    assert prediction.answer == "2017"
    (decompose,) = [call["messages"] for call in lm.history if DECOMPOSE in str(call["messages"])]
    asked = decompose[-1]["content"]
    found = retriever(QUESTION)
    assert len(found.facts) == 2 and found.ranked_ids[:2].tolist() == [fact.id for fact in found.facts]  # the top K lead the ranking
    top = [f"({retriever.facts.passages[int(retriever.facts.passage[i])].title}) {retriever.facts.text[i]}" for i in found.ranked_ids[:n]]
    if n:
        # the question's own top facts, in rank order, after the question; the demonstrations show facts too
        assert len(top) == 2 and asked.index(top[0]) < asked.index(top[1]) and asked.index(QUESTION) < asked.index(top[0])
        assert FACTS_NOTE in decompose[0]["content"] and "Kate Capshaw has been married to Steven Spielberg" in str(decompose)
    else:
        assert "[[ ## facts ## ]]" not in str(decompose) and FACTS_NOTE not in decompose[0]["content"]


def test_a_question_goes_to_the_documentation_demonstrations_only_when_nearer_them_by_the_margin():
    from modules.lm.pool import QuestionShape

    # the encyclopedia demonstration questions along x, the documentation ones along y; a question's
    # margin is then its y minus its x, worked out by hand
    asked = {"docs by 0.2": [0.6, 0.8, 0.0], "docs by 0.014": [0.7, 0.7141, 0.0], "encyclopedia by 0.2": [0.8, 0.6, 0.0],
             "neither": [0.0, 0.0, 1.0]}
    encoded = []

    def encode(text):
        encoded.append(text)
        if text in QuestionShape.ENCYCLOPEDIA:
            return [1.0, 0.0, 0.0]
        return [0.0, 1.0, 0.0] if text in QuestionShape.DOCUMENTATION else asked[text]

    shape = QuestionShape()
    assert [round(shape.margin_of(text, encode), 3) for text in asked] == [0.2, 0.014, -0.2, 0.0]
    assert [shape.documentation(text, encode) for text in asked] == [True, False, False, False]
    demonstrations = len(QuestionShape.ENCYCLOPEDIA) + len(QuestionShape.DOCUMENTATION)
    assert len(encoded) == demonstrations + 2 * len(asked)  # the demonstration questions encoded once


class Manual:
    """A QuestionShape that takes every question for one about a software manual."""

    def documentation(self, question, encode):
        return True


@pytest.mark.parametrize("documentation_demos, hop_demos", [(False, True), (True, True), (True, False)])
def test_a_documentation_question_is_shown_the_documentation_demonstrations(retriever, documentation_demos, hop_demos):
    lm = DummyLM(script())
    with dspy.context(lm=lm):
        config = ProgramConfig(documentation_demos=documentation_demos, documentation_hop_demos=hop_demos, bridge_rewrite="lm",
                               decompose_facts=2)
        program = HyperProve(retriever, config)
        program.shape = Manual()
        prediction = program(QUESTION)
    assert prediction.answer == "2017" and prediction.documentation is documentation_demos
    (decompose,) = [str(call["messages"]) for call in lm.history if DECOMPOSE in str(call["messages"])]
    hops = [str(call["messages"]) for call in lm.history if "[[ ## supporting ## ]]" in str(call["messages"])]
    assert len(hops) == 3
    # with the option, the decomposer's five documentation demos (four kinds and a comparison, with their facts) and,
    # unless documentation_hop_demos is off, the hop reader's two replace the encyclopedia ones; the final reader keeps its own
    documentation = ["Which environment variable overrides the setting that limits", "Which option can delete files: --prune or --dry-run?",
                     "BUILD_JOBS overrides build.jobs."]
    assert all((text in decompose) is documentation_demos for text in documentation)
    assert ("the Spielberg Prize" in decompose) is not documentation_demos
    shown_to_hops = documentation_demos and hop_demos
    assert all(("that the lock file is up to date" in hop) is shown_to_hops for hop in hops)
    assert all(("February 21, 2017" in hop) is not shown_to_hops for hop in hops)
