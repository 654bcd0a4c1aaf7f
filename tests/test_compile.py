"""Compiling the LM steps: training examples from gold decompositions, grades worked by hand,
and the optimizers built as configured."""

import dspy
import pytest

from experiments.data import Question, Step
from modules.errors import HyperProveError
from optimize.compile import (
    TARGETS, answer_examples, decomposition_examples, grade_answer, grade_decomposition, grade_rewrite, make_optimizer, metric,
    rewrite_examples,
)
from pipeline.config import CompileConfig, HyperProveConfig

JAWS = Question(
    id="q1", question="When did the director of Jaws' mother die?", answer="2017", answer_aliases=("February 21, 2017",),
    decomposition=(
        Step("Who directed Jaws?", "Steven Spielberg", 0),
        Step("Who was the mother of #1?", "Leah Adler", 1),
        Step("When did #2 die?", "2017", 2),
    ),
)


def test_examples_come_from_the_gold_decomposition():
    (decompose,) = decomposition_examples([JAWS, Question(id="q2", question="No gold steps?", answer="x")])
    assert decompose.inputs().toDict() == {"question": JAWS.question}
    assert decompose.sub_questions == ["Who directed Jaws?", "Who was the mother of #1?", "When did #2 die?"]
    first, second = rewrite_examples([JAWS])  # step 1 has no reference: nothing to rewrite
    assert first.inputs().toDict() == {"sub_question": "Who was the mother of #1?", "answers": ["Steven Spielberg"]}
    assert (first.resolved, first.question) == (["#1 = Steven Spielberg"], "Who was the mother of Steven Spielberg?")
    assert second.answers == ["Steven Spielberg", "Leah Adler"]
    assert (second.resolved, second.question) == (["#2 = Leah Adler"], "When did Leah Adler die?")
    (answer,) = answer_examples([JAWS])
    assert (answer.question, answer.answer, answer.aliases) == (JAWS.question, "2017", ["February 21, 2017"])


def test_grades_worked_by_hand():
    gold = decomposition_examples([JAWS])[0]
    # "who was mother of 1" against "who is mother of 1": 4 of 5 tokens shared, F1 0.8; mean (1 + 0.8 + 1) / 3.
    got = dspy.Prediction(sub_questions=["Who directed Jaws?", "Who is the mother of #1?", "When did #2 die?"])
    assert grade_decomposition(gold, got)[0] == pytest.approx(2.8 / 3)
    # A missing hop scores 0 at its position: (1 + 0) / 3 over the longer list.
    score, feedback = grade_decomposition(gold, dspy.Prediction(sub_questions=["Who directed Jaws?"]))
    assert score == pytest.approx(1 / 3) and "1 hops where 3 were needed" in feedback
    rewrite = rewrite_examples([JAWS])[0]
    assert grade_rewrite(rewrite, dspy.Prediction(query="Who is the mother of Steven Spielberg?"))[0] == pytest.approx(5 / 6)
    answer = answer_examples([JAWS])[0]
    assert grade_answer(answer, dspy.Prediction(answer="21 February 2017"))[0] == 1.0  # the alias, tokens in any order
    assert grade_answer(answer, dspy.Prediction(answer="in 2018"))[0] == 0.0
    with_feedback = metric(grade_answer, feedback=True)(answer, dspy.Prediction(answer="2017"))
    assert with_feedback.score == 1.0 and with_feedback.feedback.startswith("Gold answer: '2017'")


def test_optimizers_are_built_as_configured():
    lm = dspy.utils.DummyLM([{}])
    bootstrap = make_optimizer(CompileConfig(max_bootstrapped_demos=3, max_labeled_demos=1), TARGETS["decompose"], 10)
    assert isinstance(bootstrap, dspy.BootstrapFewShot)
    assert (bootstrap.max_bootstrapped_demos, bootstrap.max_labeled_demos, bootstrap.metric_threshold) == (3, 4, 0.6)
    program = make_optimizer(CompileConfig(target="program", threshold=0.3), TARGETS["program"], 10)
    assert (program.max_labeled_demos, program.metric_threshold) == (2, 0.3)  # answers alone are no demonstrations
    proposer = dspy.utils.DummyLM([{}])
    mipro = make_optimizer(CompileConfig(optimizer="mipro"), TARGETS["rewrite"], 10, lm=lm, prompt_lm=proposer)
    assert isinstance(mipro, dspy.MIPROv2) and (mipro.task_model, mipro.prompt_model, mipro.auto) == (lm, proposer, "light")
    gepa = make_optimizer(CompileConfig(optimizer="gepa", auto="medium"), TARGETS["decompose"], 10, lm=lm)
    assert isinstance(gepa, dspy.GEPA) and gepa.reflection_lm is lm and gepa.auto == "medium"  # reflects with the task LM
    with pytest.raises(HyperProveError, match="GEPA needs a reflection LM"):
        make_optimizer(CompileConfig(optimizer="gepa"), TARGETS["decompose"], 10)


def test_compile_config_is_checked():
    with pytest.raises(HyperProveError, match="target='answers' must be one of decompose, rewrite, program"):
        HyperProveConfig.from_dict({"compile": {"target": "answers"}})
    with pytest.raises(HyperProveError, match="optimizer='copro' must be one of bootstrap, mipro, gepa"):
        CompileConfig(optimizer="copro")
