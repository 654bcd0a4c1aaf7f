"""The LM steps, each against a scripted DummyLM: what they parse, what they reject."""

import dspy
import pytest
from dspy.utils import DummyLM

from modules.facts import ScoredFact
from modules.lm.checks import (
    answer_kind,
    contained,
    entity_problems,
    mentioned,
    named_spans,
    named_words,
    supported_span,
)
from modules.lm.predictors import (
    AnswerGenerator,
    BridgeRewriter,
    Decomposer,
    EntityExtractor,
    FactExtractor,
    HopAnswerer,
    MalformedOutput,
)
from modules.lm.references import fill_references


def scripted(*answers):
    return dspy.context(lm=DummyLM(list(answers)))


PASSAGE = "It was directed by Steven Spielberg and came out in 1975. Jawsome is not Jaws-like."


def test_fact_extractor_gives_each_fact_the_listed_entities_it_mentions():
    answer = {
        "entities": ["Jaws", "Steven Spielberg", "1975", "The"],
        "facts": ["Jaws was directed by Steven Spielberg.", "  Jaws   came out in 1975. ", "Jawsome is not Jaws-like."],
    }
    with scripted(answer):
        out = FactExtractor()(title="Jaws (film)", passage=PASSAGE)
    assert out.entities == ["Jaws", "Steven Spielberg", "1975"]  # "The" names nothing
    assert [f.text for f in out.facts] == ["Jaws was directed by Steven Spielberg.", "Jaws came out in 1975.", "Jawsome is not Jaws-like."]
    assert [f.entities for f in out.facts] == [["Jaws", "Steven Spielberg"], ["Jaws", "1975"], ["Jaws"]]
    assert mentioned(["AC/DC", "Ohio"], "They played AC/DC songs in ohio.") == ["AC/DC", "Ohio"]


def test_fact_extractor_drops_what_the_passage_does_not_say():
    answer = {
        "entities": ["Jaws", "Leah Adler", "Steven Spielberg"],
        # the second fact is copied from a demonstration: none of its 6 content words is in the passage
        "facts": ["Jaws was directed by Steven Spielberg.", "Leah Adler was born on January 12, 1920."],
    }
    with scripted(answer):
        out = FactExtractor()(title="Jaws (film)", passage=PASSAGE)
    assert [f.text for f in out.facts] == ["Jaws was directed by Steven Spielberg."]
    assert out.entities == ["Jaws", "Steven Spielberg"]


def test_entity_extractor_keeps_what_the_passage_names_and_rejects_nothing_left():
    with scripted({"entities": ["Steven  Spielberg", "1975", "Leah Adler", "Steven Spielberg"]}):
        assert EntityExtractor()(title="Jaws (film)", passage=PASSAGE).entities == ["Steven Spielberg", "1975"]
    with scripted({"entities": ["Leah Adler"]}), pytest.raises(MalformedOutput, match="no entities"):
        EntityExtractor()(title="Jaws (film)", passage=PASSAGE)


def test_fact_extractor_rejects_an_empty_answer():
    with scripted({"entities": ["Jaws"], "facts": []}), pytest.raises(MalformedOutput, match="no facts"):
        FactExtractor()(title="Jaws", passage=PASSAGE)
    with scripted({"entities": [], "facts": ["Leah Adler died in 2017."]}), pytest.raises(MalformedOutput, match="no facts"):
        FactExtractor()(title="Jaws", passage=PASSAGE)


def test_decomposer_accepts_backward_references_only():
    subs = ["Who directed Jaws?", "Who is the mother of #1?", "When did #2 die?"]
    with scripted({"sub_questions": subs}):
        assert Decomposer()(question="q").sub_questions == subs
    with scripted({"sub_questions": ["Who is the mother of #1?", "Who directed Jaws?"]}), pytest.raises(MalformedOutput, match="not yet known"):
        Decomposer()(question="q")
    with scripted({"sub_questions": ["a", "b", "c"]}), pytest.raises(MalformedOutput, match="more than 2"):
        Decomposer()(question="q", max_hops=2)
    with scripted({"sub_questions": ["  "]}), pytest.raises(MalformedOutput, match="empty"):
        Decomposer()(question="q")


JAWS_QUESTION = "When did the director of Jaws' mother die?"


def test_entity_problems_name_what_a_decomposition_drops_or_invents():
    assert named_words("When did the director of Jaws' mother die in #1 or 1975 in the U.S.?") == {"jaws", "1975"}
    assert named_words("Through Paris", skip_first=True) == {"paris"} and named_words("1975 was a year", skip_first=True) == {"1975"}
    # bracketed words may go; a sentence-initial capital is not a name
    assert entity_problems("Where was the performer of song B Boy (Song) born?", ["Who performed B Boy?", "Through whom was #1 born?"]) == []
    assert entity_problems(JAWS_QUESTION, ["Who directed Jaws?", "Who is the mother of #1?", "When did #2 die?"]) == []
    assert entity_problems(JAWS_QUESTION, ["Who directed the film?", "When did #1's mother die?"]) == ["drops 'jaws'"]
    # a name in lower case still counts as kept; a year the question never gave is invented
    assert entity_problems(JAWS_QUESTION, ["Who directed jaws in 1975?", "Who is Spielberg's mother?"]) == ["invents '1975'", "invents 'spielberg'"]


def test_decomposer_asks_again_when_a_name_is_dropped_and_keeps_the_first_clean_answer():
    dropped = {"sub_questions": ["Who directed the film?", "When did #1's mother die?"]}
    invented = {"sub_questions": ["Who directed Jaws in 1975?", "When did #1's mother die?"]}
    clean = {"sub_questions": ["Who directed Jaws?", "When did #1's mother die?"]}
    lm = DummyLM([dropped, clean, invented])
    with dspy.context(lm=lm):
        out = Decomposer()(question=JAWS_QUESTION, entity_retries=2)
    assert out.sub_questions == clean["sub_questions"] and out.problems == [] and out.attempts == 2
    assert len(lm.history) == 2  # stops at the first clean one
    # no clean one: the one with the fewest problems, the earlier among equals
    with scripted(dropped, {"sub_questions": ["Who directed Titanic in 1997?", "When did #1 die?"]}, invented):
        out = Decomposer()(question=JAWS_QUESTION, entity_retries=2)
    assert out.sub_questions == dropped["sub_questions"] and out.problems == ["drops 'jaws'"] and out.attempts == 3
    # without retries there is no check: one call, whatever it names
    lm = DummyLM([dropped])
    with dspy.context(lm=lm):
        assert Decomposer()(question=JAWS_QUESTION).sub_questions == dropped["sub_questions"]
    assert len(lm.history) == 1
    # a malformed first answer is retried too when retries are on
    with scripted({"sub_questions": ["When did #2 die?"]}, clean):
        assert Decomposer()(question=JAWS_QUESTION, entity_retries=1).sub_questions == clean["sub_questions"]


def test_named_spans_and_the_span_a_hop_answer_falls_back_to():
    assert named_spans("Leah Adler died on February 21, 2017, in Los Angeles.") == ["Leah Adler", "February 21, 2017", "Los Angeles"]
    assert named_spans("He was Prince Arthur, Duke of Connaught and Strathearn.") == ["He", "Prince Arthur, Duke of Connaught and Strathearn"]
    evidence = facts("Jaws is a 1975 film.", "Jaws was directed by Steven Spielberg.")
    # the first span, in the facts' order, of the kind asked for, that the query does not name
    assert supported_span("Who directed Jaws?", evidence) == "Steven Spielberg"  # a "who" takes no year
    assert supported_span("When was Jaws released?", evidence) == "1975"
    assert supported_span("Which year is Jaws from?", evidence) == "1975"
    assert supported_span("Jaws?", evidence, answer="1976") == "1975"  # a date answered wants a date back
    assert supported_span("Who directed Jaws?", evidence[:1]) is None  # only a year there: the answer stays
    assert supported_span("When was Jaws released?", evidence[1:]) is None
    adler = facts("Leah Adler lived in Los Angeles.", "She died on February 21, 2017, aged 97.")
    assert supported_span("When did Leah Adler die?", adler) == "February 21, 2017"
    assert supported_span("How old was Leah Adler when she died?", adler) == "97"  # the numbers of a date are no age
    assert supported_span("Where did Leah Adler live?", adler) == "Los Angeles"
    regicide = facts("Thomas Harrison 1555, London 1631 was a regicide.")
    assert supported_span("Who was a regicide?", regicide) == "Thomas Harrison, London"  # its years cut out
    assert [answer_kind(q, a) for q, a in [("When did #1 die?", ""), ("Who is #1?", "1975"), ("How many stores?", ""),
                                            ("What age?", ""), ("Who?", "82 years"), ("Where?", "Apollo 11")]] == \
        ["date", "date", "number", "number", "number", "name"]
    assert contained("Steven  Spielberg", ["T1 Jaws was directed by Steven Spielberg."])
    assert not contained("George Lucas", ["T1 Jaws was directed by Steven Spielberg."])
    assert contained("Yes", ["anything"])


def test_grounded_hop_answers_are_asked_again_then_replaced_by_a_span_of_the_cited_facts():
    evidence = facts("Jaws is a thriller film.", "Jaws was directed by Steven Spielberg.")
    lm = DummyLM([{"answer": "George Lucas", "supporting": [2]}, {"answer": "Steven Spielberg", "supporting": [2]}])
    with dspy.context(lm=lm):
        out = HopAnswerer()(question="Who directed Jaws?", facts=evidence, grounded=True)
    assert (out.answer, out.supporting, out.replaced) == ("Steven Spielberg", [10], None)
    assert len(lm.history) == 2
    with scripted({"answer": "George Lucas", "supporting": [2]}, {"answer": "Lucas", "supporting": [2]}):
        out = HopAnswerer()(question="Who directed Jaws?", facts=evidence, grounded=True)
    assert (out.answer, out.supporting, out.replaced) == ("Steven Spielberg", [10], "Lucas")
    # a right answer with the wrong citation: "cited" replaces it twice over; "evidence" keeps it, resting on the fact that has it
    studio = facts("Jaws is a Universal Pictures film.", "Jaws was directed by Steven Spielberg.")
    miscited = [{"answer": "Steven Spielberg", "supporting": [1]}] * 2
    with scripted(*miscited):
        out = HopAnswerer()(question="Who directed Jaws?", facts=studio, grounded=True)
    assert (out.answer, out.replaced) == ("Universal Pictures", "Steven Spielberg")  # the cited fact's first name the query does not name
    # a cited fact that holds no span of the kind asked (a year for "who") replaces nothing: the answer stays
    dated = facts("Jaws is a 1975 film.", "Jaws was directed by Steven Spielberg.")
    lm = DummyLM(miscited)
    with dspy.context(lm=lm):
        out = HopAnswerer()(question="Who directed Jaws?", facts=dated, grounded=True)
    assert (out.answer, out.supporting, out.replaced, out.ungrounded) == ("Steven Spielberg", [dated[0].id], None, True)
    assert len(lm.history) == 2
    lm = DummyLM(miscited[:1])
    with dspy.context(lm=lm):
        out = HopAnswerer()(question="Who directed Jaws?", facts=dated, grounded=True, grounded_in="evidence")
    assert (out.answer, out.supporting, out.replaced) == ("Steven Spielberg", [10], None) and len(lm.history) == 1
    # ungrounded but not checked: kept as the LM wrote it, one call
    lm = DummyLM([{"answer": "George Lucas", "supporting": [2]}])
    with dspy.context(lm=lm):
        assert HopAnswerer()(question="Who directed Jaws?", facts=evidence).answer == "George Lucas"
    assert len(lm.history) == 1


def test_rewriter_calls_the_lm_only_when_there_is_a_reference():
    lm = DummyLM([])
    with dspy.context(lm=lm):
        out = BridgeRewriter()(sub_question="Who directed Jaws?", answers=[])
    assert out.query == "Who directed Jaws?" and out.rewritten is False
    assert lm.history == []


def test_rewriter_checks_that_the_answer_made_it_in():
    rewrite = BridgeRewriter()
    with scripted({"question": "When did Leah Adler die?"}):
        assert rewrite(sub_question="When did #2 die?", answers=["Steven Spielberg", "Leah Adler"]).query == "When did Leah Adler die?"
    with scripted({"question": "When did she die?"}), pytest.raises(MalformedOutput, match="drops the resolved answer 'Leah Adler'"):
        rewrite(sub_question="When did #2 die?", answers=["Steven Spielberg", "Leah Adler"])
    with scripted({"question": "When did #2 die?"}), pytest.raises(MalformedOutput, match="still has a reference"):
        rewrite(sub_question="When did #2 die?", answers=["Steven Spielberg", "Leah Adler"])
    assert fill_references("When did #2 die after #1 and #7?", ["A", "B"]) == "When did B die after A and #7?"


def facts(*texts):
    return [ScoredFact(id=10 * k, text=t, passage=k, title=f"T{k}", cos=0.5, struct=0.0, score=0.5) for k, t in enumerate(texts)]


def test_hop_answerer_maps_fact_numbers_to_fact_ids():
    evidence = facts("Jaws is a film.", "Jaws was directed by Steven Spielberg.", "Spielberg was born in Cincinnati.")
    with scripted({"answer": "Steven Spielberg", "supporting": [2, 2, 9, 3]}):
        out = HopAnswerer()(question="Who directed Jaws?", facts=evidence)
    assert out.answer == "Steven Spielberg"
    assert out.supporting == [10, 20]  # numbers 2 and 3; 9 is out of range, the repeat is dropped


def test_hop_answerer_shows_numbered_facts_with_titles():
    lm = DummyLM([{"answer": "x", "supporting": [1]}])
    with dspy.context(lm=lm):
        HopAnswerer()(question="Who?", facts=facts("First fact."))
    assert "[1] (T0) First fact." in lm.history[-1]["messages"][-1]["content"]


@pytest.mark.parametrize("question, options", [
    ("Which film came out first, Jaws or Close Encounters of the Third Kind?", ["Jaws", "Close Encounters of the Third Kind"]),
    ("Which musician played in the band Soulfly, Max Cavalera or Billy Idol?", ["Max Cavalera", "Billy Idol"]),  # no comparing word
    ('Which Bulldog includes breeds such as "Standard" and "Classic," the French Bulldog or the American Bulldog?',
     ["the French Bulldog", "the American Bulldog"]),  # the last comma, quotes stripped
    ("Is Muskegon County Airport or John Wayne Airport further west?", ["Muskegon County Airport", "John Wayne Airport"]),
    ("Which magazine was started first Arthur's Magazine or First for Women?", ["Arthur's Magazine", "First"]),
    ("Who was born first out of Aivar Kuusmaa and Andy Summers?", ["Aivar Kuusmaa", "Andy Summers"]),
    ("Who directed Dead or Alive?", []),  # a title, not a choice: nothing compares
    ("What is the birthplace of the director of Love, Life or Death?", []),  # neither a choosing opening nor comparing
    ("Are Joe Walsh and Chester Bennington both guitarists?", []),
    ("Who was born first, Jaws or jaws?", []),  # the same option twice
    ("Which flag can delete files: --prune, or --dry-run?", ["--prune", "--dry-run"]),  # a comma before "or"
    ("For which command is the lock file updated automatically: install or update?", ["install", "update"]),  # "For which"
    ("In what year was Love, Life or Death made?", []),  # "In what" opens no choice
    ("or?", []),
])
def test_question_options_are_the_answers_a_question_names(question, options):
    from modules.lm.checks import question_options

    assert question_options(question) == options


def test_an_answer_names_an_option_by_its_words_either_way():
    from modules.lm.checks import names_an_option

    options = ["Hänt Extra", "Tea Moderna"]
    assert names_an_option("Tea Moderna (magazine)", options) and names_an_option("the Tea Moderna", options)
    assert names_an_option("Otto Ludwig Preminger", ["Edward Dmytryk", "Otto Preminger"])
    assert not names_an_option("Orange Field Tea Factory", options)
    assert not names_an_option("No", options) and not names_an_option("", options)


QUESTION_WITH_OPTIONS = "Which film has the director born first, Boat People or The Wind?"


def test_answer_generator_asks_for_a_choice_when_the_answer_is_no_option():
    lm = DummyLM([{"answer": "Ann Hui"}, {"answer": "Boat People"}])
    with dspy.context(lm=lm):
        out = AnswerGenerator()(question=QUESTION_WITH_OPTIONS, evidence=["Who directed Boat People? -> Ann Hui"], choose=True)
    assert (out.answer, out.replaced) == ("Boat People", "Ann Hui")
    prompt = lm.history[-1]["messages"][-1]["content"]
    assert '["Boat People", "The Wind"]' in prompt and "Who directed Boat People? -> Ann Hui" in prompt


@pytest.mark.parametrize("replies, choose, answer, calls", [
    ([{"answer": "Boat People"}], True, "Boat People", 1),  # an option: no second call
    ([{"answer": "Ann Hui"}], False, "Ann Hui", 1),  # the check is off
    ([{"answer": "Ann Hui"}, {"answer": "Victor Sjöström"}], True, "Ann Hui", 2),  # the choice is no option either
    ([{"answer": "Ann Hui"}] + [{"reply": "Boat People"}] * 2, True, "Ann Hui", 3),  # the choice does not parse (chat, then JSON)
])
def test_answer_generator_keeps_the_answer_when_no_choice_is_needed_or_made(replies, choose, answer, calls):
    lm = DummyLM(replies)
    with dspy.context(lm=lm):
        out = AnswerGenerator()(question=QUESTION_WITH_OPTIONS, evidence=["x"], choose=choose)
    assert (out.answer, out.replaced, len(lm.history)) == (answer, None, calls)


def test_answer_generator_rejects_an_empty_answer():
    with scripted({"answer": "2017"}):
        assert AnswerGenerator()(question="q", evidence=["a -> b"]).answer == "2017"
    with scripted({"answer": " "}), pytest.raises(MalformedOutput):
        AnswerGenerator()(question="q", evidence=[])


@pytest.mark.parametrize("module, demos", [(FactExtractor, [2]), (Decomposer, [2]), (BridgeRewriter, [2]), (HopAnswerer, [2]), (AnswerGenerator, [2, 2]),
                                            (EntityExtractor, [2])])
def test_every_step_ships_demonstrations(module, demos):
    predictors = [predictor for _, predictor in module().named_predictors()]
    assert [len(predictor.demos) for predictor in predictors] == demos
    for predictor in predictors:
        for demo in predictor.demos:  # every demo fills every field of the signature
            assert set(predictor.signature.fields) <= set(demo.keys())


def test_the_extraction_budget_follows_the_passage_length():
    from modules.lm.checks import extraction_budget

    lm = DummyLM([{"entities": ["Jaws"], "facts": ["Jaws was directed by Steven Spielberg."]}])
    with dspy.context(lm=lm):
        FactExtractor()(title="Jaws (film)", passage=PASSAGE)
    assert lm.history[-1]["kwargs"]["max_tokens"] == 96 + 94 // 2  # title and passage: 94 characters
    assert extraction_budget("t", "x" * 5000) == 1024


def test_the_built_in_decompositions_pass_the_entity_check():
    from modules.lm.demos import COMPARISON_DEMOS, DECOMPOSE_DEMOS

    demos = DECOMPOSE_DEMOS + COMPARISON_DEMOS
    assert [entity_problems(demo.question, demo.sub_questions) for demo in demos] == [[]] * len(demos)


def test_comparison_demos_add_two_demonstrations_and_the_instruction_to_keep_names():
    plain, comparisons = Decomposer().decompose, Decomposer(comparisons=True).decompose
    assert len(comparisons.demos) == 4 and comparisons.demos[:2] == plain.demos
    assert comparisons.demos[2].sub_questions == ["When did Jaws come out?", "When did Close Encounters of the Third Kind come out?"]
    assert "keeps the names" in comparisons.signature.instructions and "keeps the names" not in plain.signature.instructions
    assert list(comparisons.signature.fields) == list(plain.signature.fields)


def test_country_names_ground_a_country_its_facts_name_by_another_word():
    austrian = facts("Hans J. Salter (1896 in Lviv) was an Austrian-born American film composer.")
    assert not contained("Austria", ["T0 " + austrian[0].text])
    assert contained("Austria", ["T0 " + austrian[0].text], countries=True)
    assert not contained("Germany", ["T0 " + austrian[0].text], countries=True)
    with scripted({"answer": "Austria", "supporting": [1]}):
        out = HopAnswerer()(question="What country is Hans J. Salter from?", facts=austrian, grounded=True, countries=True)
    assert (out.answer, out.replaced) == ("Austria", None)
