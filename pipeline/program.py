"""`HyperProve`: the program that wires the LM steps around the deterministic retriever.

    decompose (4) -> per hop: rewrite with resolved answers (5) -> retrieve from the carried
    frontier (6-9) -> answer the hop (10) -> carry answer and supporting facts -> final answer (11)

What the program decides where METHOD.md is silent:
- The carried frontier is F_{t-1} plus the facts the hop reader cites as support; when it
  cites none (or fails), plus the hop's top-K facts, as in step 9 (`carry="top_k"` always does).
- Fallbacks, so that one question never crashes a batch: an unusable decomposition becomes one
  hop on the original question; an unusable rewrite becomes plain "#k" substitution; an
  unusable hop answer becomes the hop's best fact, so the next hop still has a bridge; an
  unusable final answer becomes the last hop's answer. Each fallback is recorded in the output.
- With `choose_options`, a final answer that is none of the options the question names is asked
  for again as a choice between them (`AnswerGenerator`); every peer's reader does the same.
- Checks a small model needs (`ProgramConfig`; on by default, chosen on train): a decomposition that drops
  or invents a name of the question is asked for again (`entity_retries`); a hop answer its
  facts do not contain is asked for again, then replaced by a span of them of the kind the hop
  asks for, a date, a number or a name (`grounded_hops`; with `grounded_in="evidence"` an
  answer that an uncited fact of the hop contains is kept).
- Chains checked (`chain_checks`, with `entity_retries`): a decomposition with a step whose
  answer no later step uses, in a question that compares nothing, is asked for again too.
- Identity steps folded (`fold_identities`): a sub-question that only asks who a named thing is
  ("Who is Max Cavalera?") is dropped and the name written where later steps refer to it (#k);
  such a hop answers with the name it was given, at the cost of a hop answer and a rewrite. Off:
  the identity hop's facts also seed the next hop, and on train folding lost as much as it won.
- Bridges by rule (`bridge_rewrite="rule"`): "#k" is replaced by the answer, without the LM
  call of step 5; on train the LM's rewrite mostly equalled the plain substitution (FINDINGS).
- Hop answers about the hop's subject (`hop_subject`): a hop answer that is the thing the hop
  asks about, or that rests on facts about something else while others of its facts name that
  thing, is asked for again, then replaced by a span of the facts that name it (a place for a
  "where" hop).
- Countries by any name (`country_names`): a hop answer naming a country its facts name by
  another word ("Austria" for "an Austrian composer") counts as grounded.
- Comparison plans (`comparison_plans`): a comparison or same-country question of a shape the
  rules read ("Which film has the director born first, X or Y?") gets its sub-questions by rule
  (`comparison_plan`: per compared thing its director, then the date or country compared), with
  no decomposer call; any other question is decomposed by the LM.
- Comparisons by rule (`compare_by_rule`): a question that orders two named options by a date,
  a number or the years lived ("Which film came out first, X or Y?"), or asks whether two things
  are from the same country, is answered from the hop answers (`modules.lm.question_types`) without
  the final reader; when a value does not parse, the reader answers and the reason is recorded.
  These two and `country_names` are on (together: 2Wiki train F1 39.8 -> 57.1 with a fifth
  fewer LM calls, FINDINGS); `hop_subject`, `chain_checks` and `last_hop_answers` are off until
  a train run shows they help.
- The last hop's answer (`last_hop_answers`): a chain of two or more hops whose last hop asks for
  the kind of answer the question asks (a date, a number, a name) and found it in its facts ends
  with that answer, without the final reader.
- The top passage's other sentences (`hop_passage_facts` N, 6): the hop reader reads the hop's K
  facts, then up to N more facts of the hop's top passage in the passage's order (what the
  passage says of its subject beyond the K facts: "Born as Leopoldo Torres Nilsson, ... the son
  of ..." does not name "Leopoldo Torre Nilsson" and ranks low). The frontier still carries the
  cited facts. On the three train splits together F1 +2.6 [+0.0, +5.2], no more calls (FINDINGS).
- Passages for Recall@k: each hop's ranked passages, interleaved rank by rank; with
  `question_channel`, the ranking for the whole question (no frontier) leads the interleaving,
  so a hop that went astray still leaves the passages the question itself points to.
- The final reader sees, by `reader_evidence`: the answered sub-questions and the facts of F_m
  with passage titles ("facts"), the answered sub-questions and the top 5 passages
  ("passages"), or the top 5 passages alone, as each peer's reader sees its own ("passages-only").
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import dspy
from dspy.utils.exceptions import AdapterParseError

from modules.errors import HyperProveError
from modules.lm.checks import fold_identities
from modules.lm.predictors import (
    EVIDENCE_PASSAGES,
    AnswerGenerator,
    BridgeRewriter,
    Decomposer,
    HopAnswerer,
    MalformedOutput,
    evidence_line,
)
from modules.lm.question_types import Decision, comparison_plan, last_hop_answer, rule_answer
from modules.lm.references import fill_references
from modules.retrieval.retriever import HypergraphRetriever, interleave_passages
from pipeline.config import ProgramConfig

# What a small model gets wrong: unparseable output, the wrong shape, values that fail validation.
LM_FAILURES = (AdapterParseError, MalformedOutput, ValueError)

# Who hears of a question's progress in this context (thread): ("plan", {"sub_questions"}), then
# ("hop", the chain entry) as each hop is answered. A context variable, so that one program
# answering in several threads at once tells each caller of its own question only.
HOP_LISTENER: ContextVar[Callable[[str, dict], None] | None] = ContextVar("hop_listener", default=None)


@contextmanager
def hops_to(listener: Callable[[str, dict], None] | None) -> Iterator[None]:
    token = HOP_LISTENER.set(listener)
    try:
        yield
    finally:
        HOP_LISTENER.reset(token)


def tell(event: str, data: dict) -> None:
    if (listener := HOP_LISTENER.get()) is not None:
        listener(event, data)


class HyperProve(dspy.Module):
    """Question -> answer and the evidence chain (per hop: sub-question, query, facts, answer)."""

    def __init__(self, retriever: HypergraphRetriever | None, config: ProgramConfig | None = None):
        """`retriever=None` gives the LM steps alone: enough to compile, save and load them."""
        super().__init__()
        self.config = config or ProgramConfig()
        self.decompose = Decomposer(comparisons=self.config.comparison_demos)
        self.rewrite = BridgeRewriter()
        self.answer_hop = HopAnswerer()
        self.generate = AnswerGenerator()
        self.retriever = retriever

    def forward(self, question: str) -> dspy.Prediction:
        if self.retriever is None:
            raise HyperProveError("this HyperProve program has no retriever: it was built to compile or save its LM steps")
        config, fallbacks = self.config, []
        planned = comparison_plan(question) if config.comparison_plans else None
        sub_questions = planned or self.sub_questions(question, fallbacks)
        tell("plan", {"sub_questions": list(sub_questions)})

        frontier: list[int] = []
        answers: list[str] = []
        chain: list[dict] = []
        hop_passages: list[list[int]] = []
        started = time.perf_counter()
        if config.question_channel:
            hop_passages.append(self.retriever(question).passages)
        retrieval_seconds = time.perf_counter() - started
        for number, sub_question in enumerate(sub_questions, start=1):
            try:
                query = self.rewrite(sub_question=sub_question, answers=answers, by_rule=config.bridge_rewrite == "rule").query
            except LM_FAILURES as error:
                query = fill_references(sub_question, answers)
                fallbacks.append(f"rewrite {number}: {error}")

            started = time.perf_counter()
            hop = self.retriever(query, frontier=frontier)
            retrieval_seconds += time.perf_counter() - started
            top_k = [fact.id for fact in hop.facts]
            evidence = list(hop.facts)
            if config.hop_passage_facts and hop.passages:
                evidence += self.retriever.passage_facts(hop.passages[0], hop.query_vector, exclude=top_k, n=config.hop_passage_facts)
            try:
                reading = self.answer_hop(question=query, facts=evidence, grounded=config.grounded_hops, grounded_in=config.grounded_in,
                                          about_subject=config.hop_subject, countries=config.country_names)
                answer, supporting = reading.answer, reading.supporting
                if reading.replaced is not None:
                    fallbacks.append(f"answer {number}: {reading.replaced!r} {reading.why}; their span {answer!r} replaces it")
                elif reading.ungrounded:
                    fallbacks.append(f"answer {number}: {answer!r} {reading.why}, and no {reading.kind} of theirs can replace it; kept")
            except LM_FAILURES as error:
                answer, supporting = (hop.facts[0].text if hop.facts else query), []
                fallbacks.append(f"answer {number}: {error}")

            carried = supporting if (config.carry == "supporting" and supporting) else top_k
            frontier = list(dict.fromkeys(frontier + carried))
            answers.append(answer)
            hop_passages.append(hop.passages)
            chain.append({
                "hop": number,
                "sub_question": sub_question,
                "query": query,
                "frontier_in": hop.trace["frontier_in"],
                "facts": [fact.to_dict() for fact in evidence],
                "answer": answer,
                "supporting": supporting,
                "passages": hop.passages[:5],
            })
            tell("hop", chain[-1])

        passages = interleave_passages(hop_passages)
        decision = self.answer_by_rule(question, chain, fallbacks)
        if decision is not None:
            final = decision.answer
        else:
            try:
                reading = self.generate(question=question, evidence=self.reader_evidence(chain, frontier, passages), choose=config.choose_options)
                final = reading.answer
                if reading.replaced is not None:
                    fallbacks.append(chosen_note(reading))
            except LM_FAILURES as error:
                final = answers[-1]
                fallbacks.append(f"final answer: {error}")
        return dspy.Prediction(
            answer=final,
            chain=chain,
            frontier=frontier,
            passages=passages,
            fallbacks=fallbacks,
            by_rule=decision.how if decision is not None else None,
            planned_by_rule=bool(planned),
            retrieval_seconds=retrieval_seconds,
        )

    def sub_questions(self, question: str, fallbacks: list[str]) -> list[str]:
        """Step 4 by the LM, checked; one hop on the question itself when it fails."""
        config = self.config
        try:
            decomposition = self.decompose(question=question, max_hops=config.max_hops, entity_retries=config.entity_retries,
                                           check_chain=config.chain_checks)
        except LM_FAILURES as error:
            fallbacks.append(f"decompose: {error}")
            return [question]
        sub_questions = decomposition.sub_questions
        if decomposition.problems:
            fallbacks.append(f"decompose: kept one that {', '.join(decomposition.problems)} after {decomposition.attempts} tries")
        if config.fold_identities:
            sub_questions, dropped = fold_identities(question, sub_questions)
            if dropped:
                fallbacks.append(f"decompose: identity steps folded into the steps that refer to them: {', '.join(map(repr, dropped))}")
        return sub_questions

    def answer_by_rule(self, question: str, chain: list[dict], fallbacks: list[str]) -> Decision | None:
        """The final answer a rule gives (`compare_by_rule`, `last_hop_answers`), else None: the
        reader answers. A comparison the rule cannot decide is noted in `fallbacks`."""
        if self.config.compare_by_rule:
            decision = rule_answer(question, chain)
            if decision is not None and decision.answer is not None:
                return decision
            if decision is not None:
                fallbacks.append(f"compare: {decision.how}; the reader answers")
        return last_hop_answer(question, chain) if self.config.last_hop_answers else None

    def reader_evidence(self, chain: list[dict], frontier: list[int], passages: list[int]) -> list[str]:
        """What the final reader sees (`ProgramConfig.reader_evidence`)."""
        corpus = self.retriever.facts.passages
        top = [evidence_line(corpus[p].title, corpus[p].text) for p in passages[:EVIDENCE_PASSAGES]]
        if self.config.reader_evidence == "passages-only":
            return top
        answered = [f"{hop['query']} -> {hop['answer']}" for hop in chain]
        return answered + (top if self.config.reader_evidence == "passages" else self.frontier_lines(frontier))

    def frontier_lines(self, frontier: list[int]) -> list[str]:
        facts = self.retriever.facts
        return [evidence_line(facts.passages[int(facts.passage[i])].title, facts.text[i]) for i in frontier]


# --- building and running the program --------------------------------------------------------------
PREDICTOR_STATE = {"demos", "signature", "traces", "train", "lm"}  # what DSPy's Predict.dump_state writes for our predictors


def _json_value(value) -> bool:
    """Plain JSON data: strings, numbers, booleans, null, and lists and objects of them."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return True
    if isinstance(value, list):
        return all(_json_value(item) for item in value)
    return isinstance(value, dict) and all(isinstance(key, str) and _json_value(item) for key, item in value.items())


def program_state(state: dict, own: dict, path: str) -> dict:
    """The part of a compiled program file that a program legitimately holds, checked: per
    predictor its demonstrations and its signature's instructions and field texts, nothing else.
    DSPy's `load_state` copies every key of a predictor's state onto it (a `config` key becomes
    call-time LM arguments such as `api_base`; an `lm` key becomes the predictor's LM), so a file
    shared between people is data to check, never state to hand over. Raises one line naming the
    first key that does not belong and the file."""
    def refuse(where: str, what: str) -> HyperProveError:
        return HyperProveError(f"--program {path}: {where}: {what}; a compiled program holds only each predictor's "
                               "demos and signature, so this file was not written by `hyperprove compile` (refused)")

    checked = {}
    for name, entry in state.items():
        if not isinstance(entry, dict):
            raise refuse(repr(name), f"holds a JSON {type(entry).__name__}, not a predictor's state (an object)")
        for key in entry:
            if key not in PREDICTOR_STATE:
                raise refuse(f"{name}.{key}", "not part of a predictor's state")
        if entry.get("lm") is not None:
            raise refuse(f"{name}.lm", "names an LM; the LM is chosen by --lm and the config, never by a program file")
        for key in ("traces", "train"):
            if entry.get(key, []) != []:
                raise refuse(f"{name}.{key}", "holds entries, where DSPy writes an empty list")
        demos = entry.get("demos", [])
        if not isinstance(demos, list) or not all(isinstance(demo, dict) and _json_value(demo) for demo in demos):
            raise refuse(f"{name}.demos", "must be a list of objects of plain JSON values")
        signature = entry.get("signature", own[name]["signature"])
        fields = signature.get("fields") if isinstance(signature, dict) else None
        if (not isinstance(signature, dict) or set(signature) - {"instructions", "fields"} or not isinstance(signature.get("instructions"), str)
                or not isinstance(fields, list) or len(fields) != len(own[name]["signature"]["fields"])
                or not all(isinstance(f, dict) and set(f) == {"prefix", "description"} and all(isinstance(v, str) for v in f.values()) for f in fields)):
            raise refuse(f"{name}.signature", "must hold the instructions (text) and, per field of the predictor, its prefix and description (texts)")
        checked[name] = {"traces": [], "train": [], "demos": demos, "signature": signature, "lm": None}
    return checked


def load_compiled(module: dspy.Module, path: str | None) -> dspy.Module:
    """Load a compiled program's state into `module` (a HyperProve, or a reader sharing its final
    predictor); nothing to do without a path. Only what `program_state` accepts is loaded. A
    predictor the file does not hold (a program compiled before that predictor existed) keeps
    its built-in demonstrations."""
    from pipeline.files import read_json

    if not path:
        return module
    if not Path(path).is_file():
        raise HyperProveError(f"--program {path}: no such file")
    state = read_json(path, "compiled program")
    if not isinstance(state, dict):
        raise HyperProveError(f"--program {path}: holds a JSON {type(state).__name__}, not a compiled HyperProve program (an object)")
    own = module.dump_state()
    if not own.keys() & state.keys():
        raise HyperProveError(f"--program {path}: not a compiled HyperProve program (it holds none of the predictors {', '.join(sorted(own))})")
    # A reader that shares the final predictor loads its part of a whole program's file.
    known = {name for name, _ in HyperProve(None).named_predictors()} | own.keys()
    unknown = sorted(set(state) - known - {"metadata"})
    if unknown:
        raise HyperProveError(f"--program {path}: {unknown[0]!r}: not a predictor of HyperProve ({', '.join(sorted(known))}); refused")
    try:
        checked = program_state({name: entry for name, entry in state.items() if name in own}, own, path)
        module.load_state({**own, **checked})
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise HyperProveError(f"--program {path}: not a compiled HyperProve program ({type(error).__name__}: {error})") from None
    return module


def program_for(retriever: HypergraphRetriever | None, config) -> HyperProve:
    """The HyperProve program of a `HyperProveConfig` around a retriever, with the compiled state
    of `program.compiled` when it names one."""
    return load_compiled(HyperProve(retriever, config.program), config.program.compiled)


_CHOSEN = re.compile(r"final answer: (.+) is none of the question's options; the reader chose (.+)")


def chosen_note(reading: dspy.Prediction) -> str:
    """The fallback line of a final answer that `AnswerGenerator(choose=True)` replaced."""
    return f"final answer: {reading.replaced!r} is none of the question's options; the reader chose {reading.answer!r}"


def answer_before_choice(note: str) -> str | None:
    """The first answer a `chosen_note` records (None for any other fallback line)."""
    import ast

    match = _CHOSEN.fullmatch(note)
    return ast.literal_eval(match.group(1)) if match else None


def format_chain(prediction: dspy.Prediction) -> list[str]:
    """The evidence chain as lines: per hop the sub-question, the query, the facts, the answer;
    `*` marks the facts the hop reader cited."""
    lines = []
    for hop in prediction.chain:
        lines.append(f"  hop {hop['hop']}: {hop['sub_question']}")
        if hop["query"] != hop["sub_question"]:
            lines.append(f"    rewritten: {hop['query']}")
        for fact in hop["facts"]:
            mark = "*" if fact["id"] in hop["supporting"] else " "
            lines.append(f"   {mark}[{fact['score']:.3f}] ({fact['title']}) {fact['text']}")
        lines.append(f"    -> {hop['answer']}")
    if prediction.get("by_rule"):
        lines.append(f"  answered by rule: {prediction.by_rule}")
    for note in prediction.fallbacks:
        lines.append(f"  fallback: {note}")
    return lines


def answer_record(question: str, prediction: dspy.Prediction) -> dict:
    return {"question": question, "answer": prediction.answer, "chain": prediction.chain, "fallbacks": prediction.fallbacks,
            **({"by_rule": prediction.by_rule} if prediction.get("by_rule") else {})}


class Asker:
    """A saved index and the program of a config, loaded once, answering questions: one for
    `ask`, many (from several threads at once) for `serve`."""

    def __init__(self, config, index_directory: str | Path, runtime=None):
        from pipeline.index.store import load_index
        from pipeline.runtime import Runtime

        self.runtime = runtime or Runtime(config)
        self.program = program_for(None, config)  # a bad --program fails before the index and the LM load
        self.index = load_index(index_directory, expect_embedder=config.index.embedder)
        self.program.retriever = self.index.retriever(config.retriever, self.runtime.embedder.encode_query)
        self.titles = [passage.title for passage in self.index.passages]
        self.passage_sources = [passage.source for passage in self.index.passages]  # "file#chunk" for a folder's passages
        # the LM, the embedder and the traces now, in this thread: DSPy is configured by the thread
        # that starts it, and questions answered in several threads share one of each
        self.runtime.session, self.runtime.traces
        self.runtime.embedder.load()

    def __call__(self, question: str, listener: Callable[[str, dict], None] | None = None) -> tuple[dict, dspy.Prediction]:
        """The answer record (the chain, the top passages with their text and files, the LM's
        cost) and the prediction;
        `listener` hears the plan and each hop as they come (`hops_to`). The LM cost is the
        question's own, with others answered at the same time in other threads."""
        if not question.strip():
            raise HyperProveError("the question is empty")
        session = self.runtime.session
        started = time.perf_counter()
        with hops_to(listener), session.profile.bill() as bill, self.runtime.question_trace(question) as finish:
            prediction = self.program(question)
            finish(prediction.answer, prediction.fallbacks)
        steps = {step: asdict(cost) for step, cost in bill.items() if cost.calls}
        record = {**answer_record(question, prediction), "passages": list(prediction.passages),
                  "sources": self.sources(prediction.passages[:5]), "lm": session.id,
                  "lm_calls": sum(cost["calls"] for cost in steps.values()), "lm_steps": steps,
                  "seconds": round(time.perf_counter() - started, 2)}
        return record, prediction

    def sources(self, passages) -> list[dict]:
        """Passages as the answer's reader sees them: id, title, text, and the file they came from."""
        return [{"id": int(p), "title": passage.title, "text": passage.text, **({"source": passage.source} if passage.source else {})}
                for p in passages for passage in [self.index.passages[p]]]


def ask(config, index_directory: str, question: str, runtime=None, log=print, profile: bool = False, html: str | None = None) -> dict:
    """Answer one question over a saved index with the program of `config`; logs the chain, with
    `profile` what each LM step cost (calls, tokens, tokens from the prompt cache, seconds), with
    `html` writes the chain as an evidence-chain page to that file, and with tracking on logs the
    question as one MLflow trace."""
    from pipeline.files import atomic_write_bytes
    from pipeline.index.corpus import text_problem
    from pipeline.lm.profile import profile_table
    from pipeline.serve.pages import chain_page

    if not question.strip():
        raise HyperProveError("the question is empty")
    if problem := text_problem(question):
        raise HyperProveError(f"the question {problem}")
    if html and Path(html).is_dir():
        raise HyperProveError(f"--html {html}: is a folder; name the page file to write")
    asker = Asker(config, index_directory, runtime)
    record, prediction = asker(question)
    traced = asker.runtime.traces.close() if asker.runtime.traces_started else 0
    log(f"Q: {question}")
    log("\n".join(format_chain(prediction)))
    log(f"A: {prediction.answer}")
    if profile:
        log(profile_table(record["lm_steps"]).rstrip())
    if html:
        atomic_write_bytes(Path(html), chain_page(record, asker.titles, sources=asker.passage_sources).encode())
        log(f"evidence chain: {html}")
    if traced:
        log(f"trace: in MLflow experiment {config.tracking.experiment!r} of {config.tracking.uri} (`hyperprove ui` shows it)")
    return record
