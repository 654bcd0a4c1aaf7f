"""Compiling the program's LM modules with a DSPy optimizer (`hyperprove compile`).

A target names what is compiled and what it is graded against:
- `decompose`: the Decomposer alone, supervised by the gold decompositions (MuSiQue's, 2Wiki's; step 4);
- `rewrite`: the BridgeRewriter alone, on the gold sub-questions with "#k" and the gold answers
  of the earlier steps, against the gold sub-question with the answers filled in (step 5);
- `steps` and `final` (`--optimizer similar` only): the decomposer and the hop reader on gold
  steps, or the final reader on gold passages (step 11), shown by similarity (`modules.lm.pool`);
- `program`: the whole HyperProve program (every predictor) against answer F1; with `similar`,
  the program's own calls on the questions it answers right, checked hop by hop against the gold
  passages, pooled for every predictor they went through (`trace_examples`).

The optimizer is BootstrapFewShot, MIPROv2 or GEPA. Whatever is compiled, the result is loaded
into a full HyperProve program and saved as its JSON state, so `ask`, `evaluate` and `demo` take
it with `--program`. Compiled demonstrations replace the built-in ones of the predictors they
cover (with `keep_builtin`, they follow them); the other predictors keep theirs.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import dspy

from experiments.data import Question, load_questions
from experiments.metrics import f1_score
from experiments.runs.tracking import active_run_id, tracked_run
from modules.errors import HyperProveError
from modules.lm.pool import ASKED, MAX_PER_CALL, Encode, representatives, unit_rows
from modules.lm.references import fill_references, references
from pipeline.config import CHOOSE, CompileConfig
from pipeline.files import atomic_write_json, check_own_file, recover, sha256_file
from pipeline.index.commands import corpus_passages
from pipeline.index.documents import Reading
from pipeline.lm.session import make_lm
from pipeline.provenance import git_state
from pipeline.runtime import Runtime

Grade = Callable[[dspy.Example, dspy.Prediction], tuple[float, str]]


# --- training examples -----------------------------------------------------------------------------
def is_program_file(data) -> bool:
    """A program file DSPy wrote (an earlier compile, which a compile may replace): its state, with DSPy's metadata."""
    return isinstance(data, dict) and isinstance(data.get("metadata"), dict) and "dependency_versions" in data["metadata"]


def natural_step(sub_question: str) -> str:
    """A gold step as a question: the "subject >> relation" steps of MuSiQue and 2Wiki become
    "What is the relation of subject?", so that demonstrations show one kind of sub-question."""
    subject, arrow, relation = sub_question.partition(" >> ")
    return f"What is the {relation.strip()} of {subject.strip()}?" if arrow else sub_question


def rewrite_examples(questions: Sequence[Question]) -> list[dspy.Example]:
    """Every gold sub-question with a reference, the gold answers before it, and its rewrite.

    The examples also carry the predictor's own fields (`resolved`, `question`), so that an
    optimizer can use them as labelled demonstrations.
    """
    examples = []
    for q in questions:
        answers = [step.answer for step in q.decomposition]
        for position, step in enumerate(q.decomposition):
            sub_question = natural_step(step.question)
            used = sorted(set(references(sub_question)))
            if not used or any(not 1 <= k <= position for k in used):
                continue
            examples.append(dspy.Example(
                sub_question=sub_question,
                answers=answers[:position],
                resolved=[f"#{k} = {answers[k - 1]}" for k in used],
                question=fill_references(sub_question, answers),
            ).with_inputs("sub_question", "answers"))
    return examples


def decomposition_examples(questions: Sequence[Question]) -> list[dspy.Example]:
    """question -> the gold sub-questions as questions (`natural_step`), "#k" kept (the field names of `Decompose`)."""
    return [
        dspy.Example(question=q.question, sub_questions=[natural_step(step.question) for step in q.decomposition]).with_inputs("question")
        for q in questions
        if q.decomposition
    ]


DEMO_FACTS = 5  # evidence facts a hop demonstration shows: a reader's evidence, trimmed to keep prompts short


def hop_examples(questions: Sequence[Question], program: dspy.Module) -> list[dspy.Example]:
    """Every gold step whose answer the program's own evidence for it holds, as the hop reader
    sees it: the step with the earlier gold answers filled in, the evidence the program would
    read for it (`HyperProve.hop_evidence` of a search without a frontier) cut to `DEMO_FACTS`
    facts that keep the supporting ones, the gold answer, and the numbers of the facts of the
    step's gold passage that contain it, and the question it is a step of (`asked`). Made by rule
    and retrieval, without an LM."""
    from modules.lm.checks import contained
    from modules.lm.predictors import numbered_evidence

    examples = []
    for q in questions:
        answers = [step.answer for step in q.decomposition]
        for step in q.decomposition:
            query = fill_references(natural_step(step.question), answers)
            hop = program.retriever(query)
            evidence = program.hop_evidence(hop)
            holds = [fact.passage == step.passage and contained(step.answer, [f"{fact.title} {fact.text}"]) for fact in evidence]
            if step.passage is None or not any(holds):
                continue
            keep = sorted([i for i, held in enumerate(holds) if held][:DEMO_FACTS]
                          + [i for i, held in enumerate(holds) if not held][: max(DEMO_FACTS - sum(holds), 0)])
            shown = [evidence[i] for i in keep]
            examples.append(dspy.Example(
                question=query, evidence=numbered_evidence(shown), answer=step.answer,
                supporting=[n for n, i in enumerate(keep, start=1) if holds[i]], asked=q.question,
            ).with_inputs("question", "evidence"))
    return examples


def final_examples(questions: Sequence[Question], program: dspy.Module) -> list[dspy.Example]:
    """Every question as the final reader (step 11) could see it with its gold evidence: the gold
    steps answered ("step -> answer", where a decomposition is given), then from each gold passage
    its facts that contain the answer and then those nearest the question, `DEMO_FACTS` facts
    in all shared among the passages (at least one each), in the passages' own order; the gold
    answer. A question whose answer (other than yes or no) nothing shown contains is left out.
    Any set with gold passages serves (HotpotQA's comparisons too). Made by rule and retrieval,
    without an LM."""
    from modules.lm.checks import contained
    from modules.lm.predictors import evidence_line

    retriever, examples = program.retriever, []
    for q in questions:
        if not q.gold_passages:
            continue
        answers = [step.answer for step in q.decomposition]
        answered = [f"{fill_references(natural_step(step.question), answers)} -> {step.answer}" for step in q.decomposition]
        vector, each = retriever.encode(q.question), max(1, DEMO_FACTS // len(q.gold_passages))
        facts = []
        for passage in q.gold_passages:
            scored = retriever.passage_facts(passage, vector)
            order = sorted(range(len(scored)), key=lambda i: (not contained(q.answer, [f"{scored[i].title} {scored[i].text}"]), -scored[i].cos, i))
            facts += [evidence_line(scored[i].title, scored[i].text) for i in sorted(order[:each])]
        evidence = answered + facts
        if contained(q.answer, evidence):
            examples.append(dspy.Example(question=q.question, evidence=evidence, answer=q.answer, asked=q.question).with_inputs("question", "evidence"))
    return examples


def grounded(answer: str, gold: str, texts: Sequence[str], last: bool) -> bool:
    """Whether a hop's answer can be checked as right: a span of a gold passage (`texts`), or a
    yes/no that the gold answer confirms (a yes under a yes question, where every hop says yes;
    the last hop's, equal to the gold answer). A hop's no, or its yes under a no question,
    cannot be checked."""
    from modules.lm.checks import contained, lower_words

    said = lower_words(answer)
    if said in ({"yes"}, {"no"}):
        told = lower_words(gold)
        return told in ({"yes"}, {"no"}) and (said == told == {"yes"} or last and said == told)
    return contained(answer, texts)


def trace_examples(questions: Sequence[Question], program: dspy.Module, threshold: float, lm=None) -> tuple[dict[str, list[dspy.Example]], int]:
    """The program's own calls, as examples for each predictor they went through (the traces
    BootstrapFewShot keeps, made into a pool): the program answers each question, and a question
    counts when its answer reaches `threshold` token F1 and every hop's answer is `grounded` in
    its gold passages, so that a lucky answer over a wrong chain teaches nothing. Of its calls,
    the decomposition the chain used, the hop readings the chain kept, the final reading that
    reaches `threshold` and the other calls are kept. Returns the examples by predictor name and
    the number of questions counted. The LM is the configured one: replaying a recorded run of
    the same program makes this free."""
    from tqdm import tqdm

    from modules.lm.checks import single_spaced
    from pipeline.program import LM_FAILURES

    names = {id(predictor): name for name, predictor in program.named_predictors()}
    corpus, examples, counted = program.retriever.facts.passages, {}, 0
    for q in tqdm(questions, desc="traces", unit="question"):
        gold = [q.answer, *q.answer_aliases]
        with dspy.context(trace=[], **({"lm": lm} if lm is not None else {})):
            try:
                prediction = program(question=q.question)
            except LM_FAILURES:
                continue
            trace = list(dspy.settings.trace)
        texts = [f"{corpus[p].title} {corpus[p].text}" for p in q.gold_passages]
        chain = prediction.chain
        if f1_score(prediction.answer, gold) < threshold or not all(
                grounded(hop["answer"], q.answer, texts, last=hop is chain[-1]) for hop in chain):
            continue
        counted += 1
        used, kept = [hop["sub_question"] for hop in chain], {single_spaced(hop["answer"]) for hop in chain}
        for predictor, inputs, output in trace:
            name, fields = names.get(id(predictor)), predictor.signature
            if name is None:
                continue
            if "sub_questions" in fields.output_fields and [single_spaced(s) for s in output.sub_questions or []] != used:
                continue  # a decomposition the entity checks sent back
            if "supporting" in fields.output_fields and single_spaced(output.answer) not in kept:
                continue  # a hop reading replaced by its evidence's span
            if name == "generate.generate" and f1_score(output.answer, gold) < threshold:
                continue
            example = {**{key: inputs[key] for key in fields.input_fields if key in inputs},
                       **{key: output[key] for key in fields.output_fields}, ASKED: q.question}
            examples.setdefault(name, []).append(dspy.Example(example).with_inputs(*fields.input_fields))
    return examples, counted


def answer_examples(questions: Sequence[Question]) -> list[dspy.Example]:
    return [dspy.Example(question=q.question, answer=q.answer, aliases=list(q.answer_aliases)).with_inputs("question") for q in questions]


# --- grades: a score in [0, 1] and a line of feedback (GEPA reads the feedback) ----------------------
def token_f1(prediction: str, gold: str) -> float:
    return f1_score(prediction, [gold])


def grade_decomposition(example: dspy.Example, prediction: dspy.Prediction) -> tuple[float, str]:
    """Mean token F1 of the sub-questions position by position, over the longer of the two lists:
    a missing or extra hop scores 0."""
    gold, got = list(example.sub_questions), list(prediction.sub_questions)
    score = sum(token_f1(p, g) for p, g in zip(got, gold)) / max(len(gold), len(got))
    hops = "the right number of hops" if len(got) == len(gold) else f"{len(got)} hops where {len(gold)} were needed"
    return score, f"Gold sub-questions: {gold}. Yours: {got} ({hops}; token F1 {score:.2f})."


def grade_rewrite(example: dspy.Example, prediction: dspy.Prediction) -> tuple[float, str]:
    score = token_f1(prediction.query, example.question)
    return score, f"Gold rewrite: {example.question!r}. Yours: {prediction.query!r} (token F1 {score:.2f})."


def grade_answer(example: dspy.Example, prediction: dspy.Prediction) -> tuple[float, str]:
    score = f1_score(prediction.answer, [example.answer, *example.get("aliases", [])])
    return score, f"Gold answer: {example.answer!r}. Yours: {prediction.answer!r} (token F1 {score:.2f})."


@dataclass(frozen=True)
class Target:
    """What a compile optimises: which part of the program, on which examples, graded how."""

    name: str
    part: Callable[[dspy.Module], dspy.Module]
    examples: Callable[[Sequence[Question]], list[dspy.Example]]
    grade: Grade
    threshold: float  # a bootstrapped trace is kept at or above this grade
    labeled_demos: bool  # whether the examples can serve as demonstrations as they are


TARGETS = {
    "decompose": Target("decompose", lambda program: program.decompose, decomposition_examples, grade_decomposition, 0.6, True),
    "rewrite": Target("rewrite", lambda program: program.rewrite, rewrite_examples, grade_rewrite, 0.8, True),
    "program": Target("program", lambda program: program, answer_examples, grade_answer, 0.5, False),
}


def metric(grade: Grade, feedback: bool = False) -> Callable:
    """A DSPy metric from a grade: the score, or (for GEPA) the score with its feedback."""

    def score(example, prediction, trace=None, pred_name=None, pred_trace=None):
        value, text = grade(example, prediction)
        return dspy.Prediction(score=value, feedback=text) if feedback else value

    return score


def mean_grade(module: dspy.Module, examples: Sequence[dspy.Example], grade: Grade, progress: str | None = None) -> float:
    """The mean grade in percent; an example the module fails on (malformed LM output) scores 0."""
    from tqdm import tqdm

    from pipeline.program import LM_FAILURES

    total = 0.0
    for example in tqdm(examples, desc=progress, unit="example", disable=progress is None):
        try:
            total += grade(example, module(**example.inputs()))[0]
        except LM_FAILURES:
            continue
    return round(100 * total / len(examples), 2)


MIPRO_MINIBATCH = 35  # MIPROv2's minibatch size; it refuses a val set smaller than this unless told not to minibatch


def dspy_labeled_demos(settings: CompileConfig, target: Target) -> int:
    """DSPy's `max_labeled_demos` for ours. DSPy's number does two things: a predictor's
    bootstrapped demos are topped up with gold examples to that count, and, when it is above 0,
    the teacher that produces the traces answers with that many gold examples as its only
    demonstrations (the program's own are dropped). Ours counts the gold ones on top of the
    bootstrapped ones; with none, or on a target whose examples are no demonstrations (answers
    alone), DSPy gets 0: the teacher is the program as it runs, and only its own graded traces
    become demonstrations."""
    gold = settings.max_labeled_demos if target.labeled_demos else 0
    return settings.max_bootstrapped_demos + gold if gold else 0


def make_optimizer(settings: CompileConfig, target: Target, n_train: int, lm=None, prompt_lm=None, threads: int = 1):
    """The configured DSPy optimizer, its metric built from the target's grade. `lm` answers
    (the task model); `prompt_lm` proposes instructions (MIPROv2) or reflects (GEPA), default `lm`."""
    prompt_lm = prompt_lm or lm
    labeled = dspy_labeled_demos(settings, target)
    threshold = settings.threshold if settings.threshold is not None else target.threshold
    if settings.optimizer == "bootstrap":
        return dspy.BootstrapFewShot(
            metric=metric(target.grade), metric_threshold=threshold, max_bootstrapped_demos=settings.max_bootstrapped_demos,
            max_labeled_demos=labeled, max_errors=n_train,  # a small model's malformed answers are expected
        )
    # `budget` replaces DSPy's auto presets, which are hundreds of calls: too many for a local model.
    auto = None if settings.budget else settings.auto
    if settings.optimizer == "mipro":
        return dspy.MIPROv2(
            metric=metric(target.grade), prompt_model=prompt_lm, task_model=lm, auto=auto, num_candidates=settings.budget,
            max_bootstrapped_demos=settings.max_bootstrapped_demos, max_labeled_demos=labeled, num_threads=threads,
            seed=settings.seed, metric_threshold=threshold, max_errors=n_train,
        )
    if settings.optimizer == "gepa":
        if prompt_lm is None:
            raise HyperProveError("compile: GEPA needs a reflection LM")
        return dspy.GEPA(metric=metric(target.grade, feedback=True), auto=auto, max_metric_calls=settings.budget,
                         reflection_lm=prompt_lm, num_threads=threads, seed=settings.seed)
    raise HyperProveError(f"compile: unknown optimizer {settings.optimizer!r}")


def split_examples(settings: CompileConfig, examples: list[dspy.Example]) -> tuple[list[dspy.Example], list[dspy.Example]]:
    """The first `train` examples to compile on, the next `val` to score before and after."""
    train, val = examples[: settings.train], examples[settings.train : settings.train + settings.val]
    if not train:
        raise HyperProveError(f"compile --target {settings.target}: no training examples in {settings.questions}"
                              + (" (it needs gold decompositions: MuSiQue, 2Wiki)" if settings.target in DECOMPOSED else ""))
    return train, val


def save_program(program: dspy.Module, path: str | Path) -> None:
    """The program's state as JSON (what `--program` loads), written atomically: DSPy writes it
    into a scratch folder named like every other scratch (see `pipeline.files.recover`)."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover(path)
    scratch = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    scratch.mkdir(exist_ok=True)
    try:
        program.save(str(scratch / "program.json"))
        os.replace(scratch / "program.json", path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_pairing(settings: CompileConfig) -> None:
    """Refuses, in one line and before any work, a target the optimizer cannot compile."""
    if settings.optimizer != "similar":
        if settings.target not in TARGETS:
            raise HyperProveError(f"compile --target {settings.target}: only --optimizer similar compiles it")
        if settings.choose != "call":
            raise HyperProveError(f"compile --choose {settings.choose}: only --optimizer similar chooses among gold examples")
        return
    if not 1 <= settings.max_labeled_demos <= MAX_PER_CALL:
        raise HyperProveError(f"compile --optimizer similar: --labeled-demos {settings.max_labeled_demos} must be 1 to {MAX_PER_CALL} (shown per call)")


# target -> its examples by predictor name, from the pooled questions (the hop reader's need the program's retriever)
POOLS = {
    "decompose": lambda questions, program: {"decompose.decompose": decomposition_examples(questions)},
    "rewrite": lambda questions, program: {"rewrite.rewrite": rewrite_examples(questions)},
    "steps": lambda questions, program: {"decompose.decompose": decomposition_examples(questions), "answer_hop.answer": hop_examples(questions, program)},
    "final": lambda questions, program: {"generate.generate": final_examples(questions, program)},
}
TRACED = "program"  # the target `similar` pools from the program's own graded traces (`trace_examples`), with the LM
RETRIEVING = ("program", "steps", "final")  # targets whose examples or grades need the index's retriever
DECOMPOSED = ("decompose", "rewrite", "steps")  # targets made from gold decompositions


def pool_program(program: dspy.Module, settings: CompileConfig, questions: Sequence[Question], encode: Encode | None = None, lm=None) -> dict:
    """`similar`: each covered predictor pools its examples from the first `train` questions
    (after any pool the program already holds) and shows `max_labeled_demos` of them to each
    call, after its built-in demonstrations with `keep_builtin`, instead of them otherwise.
    `choose` says which: the nearest to each call or to the question asked (a pool,
    `modules.lm.pool`), or, with `encode`, the pool's representatives, fixed once
    (`representatives`), which a prompt cache keeps. Gold examples need no LM; the `program`
    target's traces are the program's own answers (`lm`)."""
    check_pairing(settings)
    if settings.choose == "once" and encode is None:
        raise HyperProveError("compile --choose once: choosing representatives needs the embedder (encode)")
    predictors, pooled, traced = dict(program.named_predictors()), {}, None
    questions = list(questions)[: settings.train]
    if settings.target == TRACED:
        threshold = settings.threshold if settings.threshold is not None else TARGETS[TRACED].threshold
        made, counted = trace_examples(questions, program, threshold, lm)
        traced = {"questions": len(questions), "counted": counted, "threshold": threshold}
        if not made:
            raise HyperProveError(f"compile --target {TRACED} --optimizer similar: the program answered none of the {len(questions)} "
                                  f"questions of {settings.questions} right with every hop in its gold passages")
    else:
        made = POOLS[settings.target](questions, program)
    for name, examples in made.items():
        predictor = predictors[name]
        if not examples:
            raise HyperProveError(f"compile --optimizer similar: no {name} examples in {settings.questions}")
        keys = [*predictor.signature.fields, ASKED]
        # a program compiled before (`--program`) keeps its pool: compiles on several sets' questions add up
        pool = list(predictor.pool) + [{key: example[key] for key in keys if key in example} for example in examples]
        by = "question" if settings.choose == "question" and ASKED in pool[0] else "call"
        try:
            predictor.use_pool(pool, settings.max_labeled_demos, by)
        except ValueError as error:
            raise HyperProveError(f"compile --optimizer similar: {name}: {error}; compile it without the option that adds the field") from None
        builtin = list(predictor.demos) if settings.keep_builtin else []
        if settings.choose == "once":
            chosen = representatives(unit_rows(encode, [example[predictor.key] for example in pool]), settings.max_labeled_demos)
            predictor.use_pool([], 0)
            builtin += [dspy.Example({field: pool[i][field] for field in predictor.signature.fields}) for i in chosen]
        predictor.demos = builtin
        pooled[name] = len(pool)
    return {
        "target": settings.target,
        "optimizer": settings.optimizer,
        "train_examples": sum(pooled.values()),
        "val_examples": 0,
        "val_before": None,
        "val_after": None,
        "pooled": pooled,
        "per_call": settings.max_labeled_demos,
        "choose": settings.choose,
        "demos": {name: len(predictor.demos) for name, predictor in program.named_predictors()},
        **({"traced": traced} if traced else {}),
    }


def compile_program(program: dspy.Module, settings: CompileConfig, questions: Sequence[Question], lm, prompt_lm=None,
                    threads: int = 1, encode: Encode | None = None) -> dict:
    """Compile the target part of `program` in place; returns what happened (scores, demos, sizes).
    `encode` (the index's query encoder) is what `similar --choose once` compares examples with."""
    if settings.optimizer == "similar":
        return pool_program(program, settings, questions, encode, lm)
    check_pairing(settings)
    target = TARGETS[settings.target]
    train, val = split_examples(settings, target.examples(questions))
    part = target.part(program)
    before = mean_grade(part, val, target.grade, progress="val before") if val else None
    optimizer = make_optimizer(settings, target, len(train), lm, prompt_lm, threads)
    compile_args = {"valset": val} if val and settings.optimizer in ("mipro", "gepa") else {}
    if settings.optimizer == "mipro":
        compile_args["minibatch"] = len(val) > MIPRO_MINIBATCH  # a small val set is scored whole on every trial
        if settings.budget:
            compile_args["num_trials"] = settings.budget
    builtin = {name: list(predictor.demos) for name, predictor in part.named_predictors()}
    compiled = optimizer.compile(part.deepcopy(), trainset=train, **compile_args)
    part.load_state(compiled.dump_state())  # into the full program, whose other predictors are untouched
    for name, predictor in part.named_predictors():
        # The hand-written examples first, then what the optimizer chose; and a predictor that no
        # trace reached (the rewrite when bridges are filled by rule) keeps them instead of none.
        if settings.keep_builtin or not predictor.demos:
            predictor.demos = builtin[name] + [demo for demo in predictor.demos if demo not in builtin[name]]
    after = mean_grade(part, val, target.grade, progress="val after") if val else None
    return {
        "target": target.name,
        "optimizer": settings.optimizer,
        "train_examples": len(train),
        "val_examples": len(val),
        "val_before": before,
        "val_after": after,
        "val_selects": "valset" in compile_args,  # the optimizer chose on val too: `val_after` is optimistic
        "demos": {name: len(predictor.demos) for name, predictor in program.named_predictors()},
    }


def run_compile(config, runtime=None, log: Callable[[str], None] = print) -> dict:
    """`hyperprove compile` as one function: compile the configured target, write the program and
    its record (`<out>.record.json`, how it was made), and log one MLflow run."""
    from experiments.harness import timestamp
    from pipeline.index.store import cached_index
    from pipeline.program import program_for

    source = git_state()
    settings = config.compile
    if not settings.questions or not settings.corpus:
        raise HyperProveError("compile: give --questions and --corpus (or a --config with compile.questions and compile.corpus)")
    check_pairing(settings)
    out = Path(settings.out or Path(".hyperprove") / "programs" / f"{settings.target}-{settings.optimizer}-{timestamp()}.json")
    check_own_file(out, is_program_file, "a compiled program", "--out")
    passages, _ = corpus_passages(settings.corpus, Reading.of(config.index), log)
    questions = load_questions(settings.questions, passages)[settings.skip :]
    if not questions:
        raise HyperProveError(f"compile: --skip {settings.skip} leaves none of the questions in {settings.questions}")
    if settings.target in DECOMPOSED and not any(q.decomposition for q in questions):
        raise HyperProveError(f"{settings.questions}: --target {settings.target} needs gold decompositions (MuSiQue's or 2Wiki's); none found")
    program = program_for(None, config)  # from --program, when given: compiling continues from it
    runtime = runtime or Runtime(config)
    session = runtime.session
    if settings.target in RETRIEVING:
        index, _ = cached_index(passages, config, runtime, log)
        runtime.embedder.load()
        program.retriever = index.retriever(config.retriever, runtime.embedder.encode_query)
    if settings.choose == "once":
        runtime.embedder.load()
    prompt_lm = make_lm(config.with_overrides(lm={"model": settings.prompt_lm}).lm) if settings.prompt_lm else None
    log(f"compile: {settings.target} with {settings.optimizer} on {settings.questions}, LM {session.id}")
    tags = {"hyperprove.kind": "compile", "hyperprove.lm": session.id, **source}
    with tracked_run(config.tracking, config.to_dict(), f"compile-{settings.target}-{settings.optimizer}", tags) as mlflow:
        if mlflow is not None:
            import mlflow.dspy  # the optimizer's settings, trainset, valset and compiled state go into this run

            mlflow.dspy.autolog(log_compiles=True, log_traces=False, log_traces_from_compile=False, log_traces_from_eval=False, silent=True)
        started = time.perf_counter()
        report = compile_program(program, settings, questions, session.lm, prompt_lm, threads=config.lm.concurrency,
                                 encode=runtime.embedder.encode_query if settings.choose == "once" else None)
        report.update(seconds=round(time.perf_counter() - started, 1), lm_calls=session.calls(), lm=session.id, program=str(out))
        save_program(program, out)
        if session.record is not None and report["lm_calls"]:  # the LM calls it made, replayable with --replay
            report["lm_record"] = session.record.write(calls_path(out))
        if mlflow is not None:
            mlflow.log_metrics({f"val_{when}": report[f"val_{when}"] for when in ("before", "after") if report[f"val_{when}"] is not None})
            mlflow.log_artifact(str(out))
            if session.record is not None:
                mlflow.log_artifact(str(calls_path(out)))
            report["mlflow_run"] = active_run_id(mlflow)
        atomic_write_json(record_path(out), {**report, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **source,
                                             "program_sha256": sha256_file(out), "config": config.to_dict()})
    scores = f"; validation grade {report['val_before']} -> {report['val_after']} on {report['val_examples']} examples" if report["val_examples"] else ""
    if report.get("val_selects"):
        scores += f" ({settings.optimizer} also chose on them, so the second grade is optimistic: evaluate on dev to know)"
    log(f"compiled {settings.target} in {report['seconds']:.0f} s ({report['lm_calls']} LM calls){scores}")
    if "traced" in report:
        traced = report["traced"]
        log(f"traced: {traced['counted']} of {traced['questions']} questions answered right (token F1 >= {traced['threshold']}) "
            "with every hop's answer in their gold passages")
    log(f"demos per predictor: {report['demos']}" + (f"; {'traced' if 'traced' in report else 'gold'} examples, {CHOOSE[report['choose']].format(n=report['per_call'])}: {report['pooled']}"
                                                      if "pooled" in report else ""))
    log(f"program written to {out} (how it was made: {record_path(out)}"
        + (f"; its {report['lm_record']['calls']} LM calls: {calls_path(out)}" if "lm_record" in report else "") + f"); use it with --program {out}")
    return report


def record_path(program: Path) -> Path:
    """Where the record of how a compiled program was made lies: beside it (the report reads it)."""
    return Path(program).with_suffix(".record.json")


def calls_path(program: Path) -> Path:
    """Where the LM calls that compiled a program lie: beside it, as `pipeline.lm.record` writes them."""
    return Path(program).with_suffix(".lm_calls.jsonl.gz")
