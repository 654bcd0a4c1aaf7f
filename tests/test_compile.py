"""Compiling the LM steps: training examples from gold decompositions, grades worked by hand,
the optimizers built as configured, and MIPROv2 and GEPA run end to end on a scripted LM."""

import json
import re

import dspy
import numpy as np
import pytest

from experiments.data import GoldHop, Question
from modules.errors import HyperProveError
from optimize.compile import (
    TARGETS,
    answer_examples,
    compile_program,
    decomposition_examples,
    grade_answer,
    grade_decomposition,
    grade_rewrite,
    grounded,
    make_optimizer,
    metric,
    natural_step,
    pool_program,
    rewrite_examples,
)
from pipeline.config import CompileConfig, HyperProveConfig, ProgramConfig
from pipeline.program import HyperProve

JAWS = Question(
    id="q1", question="When did the director of Jaws' mother die?", answer="2017", answer_aliases=("February 21, 2017",),
    decomposition=(
        GoldHop("Who directed Jaws?", "Steven Spielberg", 0),
        GoldHop("Who was the mother of #1?", "Leah Adler", 1),
        GoldHop("When did #2 die?", "2017", 2),
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
    assert (program.max_labeled_demos, program.metric_threshold) == (0, 0.3)  # answers alone are no demonstrations
    own = make_optimizer(CompileConfig(max_bootstrapped_demos=2, max_labeled_demos=0), TARGETS["decompose"], 10)
    assert own.max_labeled_demos == 0  # DSPy's teacher keeps the program's own demonstrations (below)
    proposer = dspy.utils.DummyLM([{}])
    mipro = make_optimizer(CompileConfig(optimizer="mipro"), TARGETS["rewrite"], 10, lm=lm, prompt_lm=proposer)
    assert isinstance(mipro, dspy.MIPROv2) and (mipro.task_model, mipro.prompt_model, mipro.auto) == (lm, proposer, "light")
    gepa = make_optimizer(CompileConfig(optimizer="gepa", auto="medium"), TARGETS["decompose"], 10, lm=lm)
    assert isinstance(gepa, dspy.GEPA) and gepa.reflection_lm is lm and gepa.auto == "medium"  # reflects with the task LM
    with pytest.raises(HyperProveError, match="GEPA needs a reflection LM"):
        make_optimizer(CompileConfig(optimizer="gepa"), TARGETS["decompose"], 10)
    # a fixed budget instead of the auto presets
    gepa = make_optimizer(CompileConfig(optimizer="gepa", budget=40), TARGETS["decompose"], 10, lm=lm)
    assert (gepa.auto, gepa.max_metric_calls) == (None, 40)
    mipro = make_optimizer(CompileConfig(optimizer="mipro", budget=4), TARGETS["decompose"], 10, lm=lm)
    assert (mipro.auto, mipro.num_candidates) == (None, 4)


def test_compile_config_is_checked():
    with pytest.raises(HyperProveError, match="target='answers' must be one of 'decompose', 'rewrite', 'steps', 'final', 'program'"):
        HyperProveConfig.from_dict({"compile": {"target": "answers"}})
    with pytest.raises(HyperProveError, match="optimizer='copro' must be one of 'bootstrap', 'mipro', 'gepa', 'similar'"):
        CompileConfig(optimizer="copro")
    with pytest.raises(HyperProveError, match=r"budget=0 must lie in \[1, 1000000\]"):
        CompileConfig(budget=0)


class FieldFillingEngine:
    """A scripted `dspy.LM` engine for optimizers that write prompts: it fills whichever output
    fields the prompt asks for with `reply(fields, system, user)`, in the format the prompt asks
    for (DSPy's chat fields, or JSON when its JSON adapter falls back), so the proposer's and the
    reflector's own signatures are answered without scripting their number or order."""

    def __init__(self, reply):
        self.reply = reply

    def complete(self, request):
        from dspy.lm15 import Message, Response, TextPart, Usage

        system = request.system if isinstance(request.system, str) else "".join(part.text for part in request.system or ())
        listed = system.split("Your output fields are:", 1)[1].split("All interactions", 1)[0]
        values = self.reply(re.findall(r"^\d+\. `(\w+)`", listed, re.MULTILINE), system, request.messages[-1].text)
        if "JSON object" in system:
            text = json.dumps(values)
        else:
            text = "".join(f"[[ ## {name} ## ]]\n{value if isinstance(value, str) else json.dumps(value)}\n\n"
                           for name, value in values.items()) + "[[ ## completed ## ]]"
        return Response(id=None, model="scripted", message=Message.assistant([TextPart(text)]), finish_reason="stop", usage=Usage())


TRAINING = [JAWS] + [
    Question(id=f"q{n}", question=question, answer=answers[-1], decomposition=tuple(GoldHop(s, a, None) for s, a in zip(steps, answers)))
    for n, (question, steps, answers) in enumerate([
        ("Who is the spouse of the Green performer?", ["Who performed Green?", "Who is the spouse of #1?"], ["Steve Hillage", "Miquette Giraudy"]),
        ("In which county was Eric Carmen born?", ["Where was Eric Carmen born?", "In which county is #1?"], ["Cleveland", "Cuyahoga County"]),
        ("Who founded the label of Hungry Eyes?", ["Which label released Hungry Eyes?", "Who founded #1?"], ["RCA Records", "David Sarnoff"]),
    ], start=2)
]
MARK = "Give one sub-question per hop."  # what the scripted proposer writes; the task LM decomposes well only when told it


def scripted_reply(fields, system, user):
    if fields == ["sub_questions"]:  # the task: gold sub-questions under the proposed instruction, else the question whole
        asked = next(q for q in TRAINING if q.question in user)
        told = MARK in system
        return {"sub_questions": [step.question for step in asked.decomposition] if told else [asked.question]}
    return {name: MARK for name in fields}  # the proposer's or reflector's own fields


@pytest.mark.parametrize("optimizer", ["gepa", "mipro"])
def test_gepa_and_miprov2_compile_end_to_end_within_a_budget(optimizer):
    """The prompt optimizers run through `compile_program` and keep the instruction that scores
    better: the grade on the val examples goes from the one-hop decomposition's to 100."""
    from optimize.compile import compile_program
    from pipeline.program import HyperProve

    lm = dspy.LM("scripted/field-filler", engine=FieldFillingEngine(scripted_reply), cache=False)
    program = HyperProve(retriever=None)
    settings = CompileConfig(optimizer=optimizer, train=2, val=2, budget=6 if optimizer == "mipro" else 20, max_bootstrapped_demos=0,
                             max_labeled_demos=0)
    with dspy.context(lm=lm):
        report = compile_program(program, settings, TRAINING, lm)
    # before: the question whole; graded against two gold sub-questions, the second scores 0
    before = [grade_decomposition(example, dspy.Prediction(sub_questions=[example.question]))[0]
              for example in decomposition_examples(TRAINING[2:])]
    assert report["val_before"] == round(100 * sum(before) / 2, 2) and report["val_before"] < 50
    assert report["val_after"] == 100.0 and report["val_selects"] is True  # they chose on the val examples too
    assert MARK in program.decompose.decompose.signature.instructions


@pytest.mark.parametrize("keep", [False, True])
def test_the_built_in_demonstrations_stay_ahead_of_the_compiled_ones_when_asked(keep):
    """BootstrapFewShot on two training questions the task LM answers with one hop (below the
    grade, so nothing is bootstrapped): the two gold examples fill the demonstrations instead
    (one labelled, plus the unused bootstrap slot)."""
    from modules.lm.demos import COMPARISON_DEMOS, DECOMPOSE_DEMOS
    from optimize.compile import compile_program
    from pipeline.program import HyperProve

    lm = dspy.LM("scripted/field-filler", engine=FieldFillingEngine(scripted_reply), cache=False)
    program = HyperProve(retriever=None)
    settings = CompileConfig(optimizer="bootstrap", train=2, val=0, max_bootstrapped_demos=1, max_labeled_demos=1, keep_builtin=keep)
    with dspy.context(lm=lm):
        report = compile_program(program, settings, TRAINING, lm)
    demos = program.decompose.decompose.demos
    gold = [demo for demo in demos if demo not in DECOMPOSE_DEMOS + COMPARISON_DEMOS]
    assert sorted(demo["question"] for demo in gold) == sorted(q.question for q in TRAINING[:2])
    assert demos == (DECOMPOSE_DEMOS + COMPARISON_DEMOS + gold if keep else gold)
    assert report["demos"]["decompose.decompose"] == len(demos)


def test_with_no_gold_examples_the_teacher_answers_with_the_programs_own_demonstrations():
    """DSPy's teacher swaps the program's demonstrations for gold examples whenever its
    max_labeled_demos is above 0, so the traces copy the gold style; `--labeled-demos 0` reaches
    DSPy as 0, and the teacher then prompts with the built-in demonstrations ("Spielberg Prize")."""
    from optimize.compile import compile_program
    from pipeline.program import HyperProve

    prompts = []

    class Recording(FieldFillingEngine):
        def complete(self, request):
            prompts.append(" ".join(message.text for message in request.messages))
            return super().complete(request)

    def gold_steps(fields, system, user):  # every trace passes the grade
        asked = next(q for q in TRAINING if q.question in user)
        return {"sub_questions": [step.question for step in asked.decomposition]}

    for gold, builtin_in_prompt in ((0, True), (1, False)):
        prompts.clear()
        lm = dspy.LM("scripted/recording", engine=Recording(gold_steps), cache=False)
        program = HyperProve(retriever=None)
        settings = CompileConfig(optimizer="bootstrap", train=2, val=0, max_bootstrapped_demos=2, max_labeled_demos=gold)
        with dspy.context(lm=lm):
            compile_program(program, settings, TRAINING, lm)
        assert len(prompts) == 2 and all(("Spielberg Prize" in prompt) is builtin_in_prompt for prompt in prompts)
        demos = program.decompose.decompose.demos
        assert [demo["question"] for demo in demos] == [q.question for q in TRAINING[:2]]
        assert all(demo.get("augmented") for demo in demos)  # the teacher's traces, no gold example


def test_a_predictor_no_trace_reached_keeps_its_built_in_demonstrations():
    """The task LM answers with the question whole, below the grade: nothing is bootstrapped and,
    with no gold examples, the optimizer leaves Decompose with no demonstrations; it keeps its own."""
    from modules.lm.demos import COMPARISON_DEMOS, DECOMPOSE_DEMOS
    from optimize.compile import compile_program
    from pipeline.program import HyperProve

    lm = dspy.LM("scripted/field-filler", engine=FieldFillingEngine(scripted_reply), cache=False)
    program = HyperProve(retriever=None)
    settings = CompileConfig(optimizer="bootstrap", train=2, val=0, max_bootstrapped_demos=2, max_labeled_demos=0)
    with dspy.context(lm=lm):
        report = compile_program(program, settings, TRAINING, lm)
    assert program.decompose.decompose.demos == DECOMPOSE_DEMOS + COMPARISON_DEMOS
    assert report["demos"]["decompose.decompose"] == 4


def test_gold_steps_become_questions_of_one_kind():
    assert natural_step("Hello Love >> performer") == "What is the performer of Hello Love?"
    assert natural_step("#1 >> country of citizenship") == "What is the country of citizenship of #1?"
    assert natural_step("Who directed Jaws?") == "Who directed Jaws?"
    wiki = Question(id="w", question="Where did the performer of Hello Love die?", answer="Nashville", decomposition=(
        GoldHop("Hello Love >> performer", "Hank Snow", 0), GoldHop("#1 >> place of death", "Nashville", 1)))
    (decompose,) = decomposition_examples([wiki])
    assert decompose.sub_questions == ["What is the performer of Hello Love?", "What is the place of death of #1?"]
    (rewrite,) = rewrite_examples([wiki])
    assert (rewrite.sub_question, rewrite.question) == ("What is the place of death of #1?", "What is the place of death of Hank Snow?")


def test_similar_pools_only_labelled_targets_and_shows_one_to_sixteen_a_call():
    program = HyperProve(None)
    with pytest.raises(HyperProveError, match=r"--labeled-demos 17 must be 1 to 16 \(shown per call\)"):
        pool_program(program, CompileConfig(optimizer="similar", max_labeled_demos=17), [JAWS])
    with pytest.raises(HyperProveError, match="compile --target steps: only --optimizer similar compiles it"):
        compile_program(program, CompileConfig(target="steps"), [JAWS], lm=None)
    with pytest.raises(HyperProveError, match=re.escape("decompose.decompose: pool example 1 has no 'facts' (the predictor reads question, facts, sub_questions); "
                                                 "compile it without the option that adds the field")):
        pool_program(HyperProve(None, ProgramConfig(decompose_facts=3)), CompileConfig(optimizer="similar"), TRAINING)
    report = pool_program(program, CompileConfig(optimizer="similar", max_labeled_demos=2, keep_builtin=True), TRAINING)
    assert (report["pooled"], report["per_call"]) == ({"decompose.decompose": 4}, 2)
    assert report["demos"]["decompose.decompose"] == 4  # the built-in ones stay, ahead of the chosen ones
    pooled = program.decompose.decompose.pool
    assert pooled[1] == {"question": "Who is the spouse of the Green performer?", "sub_questions": ["Who performed Green?", "Who is the spouse of #1?"]}
    # compiling the program again (`--program`) on more questions adds theirs to its pool
    report = pool_program(program, CompileConfig(optimizer="similar", max_labeled_demos=3), TRAINING[3:])
    assert (report["pooled"], program.decompose.decompose.per_call) == ({"decompose.decompose": 5}, 3)
    assert program.decompose.decompose.pool == pooled + [{"question": TRAINING[3].question, "sub_questions": ["Which label released Hungry Eyes?", "Who founded #1?"]}]


def test_a_traced_hop_counts_only_where_its_answer_can_be_checked():
    passages = ["Steven Spielberg Steven Spielberg is an American film director. His mother was Leah Adler."]
    assert grounded("Leah Adler", "2017", passages, last=False)
    assert not grounded("Los Angeles", "2017", passages, last=False)
    # yes/no: a yes under a yes question (every hop says yes); the last hop's answer equal to the gold one
    assert grounded("Yes", "yes", [], last=False) and grounded("yes", "yes", [], last=True)
    assert grounded("no", "No", [], last=True)
    # a no before the last hop, a yes under a no question, any yes/no under a question that is not yes/no: unknown
    assert not grounded("no", "no", [], last=False) and not grounded("yes", "no", [], last=False)
    assert not grounded("No", "yes", [], last=True) and not grounded("yes", "Leah Adler", ["yes"], last=False)


def test_representatives_cover_the_examples_greedily_worked_by_hand():
    from modules.lm.pool import representatives

    rows = np.array([[1, 0], [1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32)
    # Column sums of the clipped cosines: 2.6, 2.6, 1.8, 3.0 -> the fourth. What it leaves: rows served 0.6, 0.6, 0.8, 1;
    # the first adds 0.4 + 0.4 (the second the same, a higher index), the third 0.2 -> the first; then the third adds 0.2.
    assert representatives(rows, 3) == [3, 0, 2]
    assert representatives(rows, 9) == [3, 0, 2, 1]


def test_similar_once_fixes_the_representatives_as_demonstrations_and_keeps_no_pool():
    # vectors chosen so that the representatives are known: those of the rows above, in TRAINING's order
    vectors = {q.question: np.array(row, dtype=np.float32) for q, row in zip(TRAINING, [[1, 0], [1, 0], [0, 1], [0.6, 0.8]])}
    program = HyperProve(None)
    with pytest.raises(HyperProveError, match="compile --choose once: choosing representatives needs the embedder"):
        pool_program(program, CompileConfig(optimizer="similar", choose="once"), TRAINING)
    with pytest.raises(HyperProveError, match="compile --choose once: only --optimizer similar chooses among gold examples"):
        compile_program(program, CompileConfig(optimizer="bootstrap", choose="once"), TRAINING, lm=None)
    report = compile_program(program, CompileConfig(optimizer="similar", choose="once", max_labeled_demos=2), TRAINING, lm=None,
                             encode=vectors.__getitem__)
    assert (report["choose"], report["pooled"], report["demos"]["decompose.decompose"]) == ("once", {"decompose.decompose": 4}, 2)
    predictor = program.decompose.decompose
    assert predictor.pool == [] and "pool" not in predictor.dump_state()
    assert [demo.toDict() for demo in predictor.demos] == [
        {"question": "Who founded the label of Hungry Eyes?", "sub_questions": ["Which label released Hungry Eyes?", "Who founded #1?"]},
        {"question": JAWS.question, "sub_questions": ["Who directed Jaws?", "Who was the mother of #1?", "When did #2 die?"]},
    ]
