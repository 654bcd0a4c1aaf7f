"""`HyperProve`: the program that wires the LM modules around the deterministic retriever.

    decompose (4) -> per hop: rewrite with resolved answers (5) -> retrieve from the carried
    frontier (6-9) -> answer the hop (10) -> carry answer and supporting facts -> final answer (11)

Where METHOD.md is silent, the program carries F_{t-1} plus the facts the hop reader cites (its
top-K facts when it cites none, or always with `carry="top_k"`), and never lets one question
crash a batch: each LM module that fails falls back on plain data (one hop on the question, "#k"
substitution, the hop's best fact, the last hop's answer) and the fallback is recorded. The
checks and rules a small model needs are `ProgramConfig` options, each described there;
`experiments/FINDINGS.md` holds what train runs measured for each.
"""

from __future__ import annotations

import time
from pathlib import Path

import dspy
from dspy.utils.exceptions import AdapterParseError

from modules.errors import HyperProveError
from modules.facts import ScoredFact
from modules.lm.pool import BY, MAX_PER_CALL, QuestionShape
from modules.lm.predictors import (
    EVIDENCE_PASSAGES,
    AnswerGenerator,
    BridgeRewriter,
    Decomposer,
    HopAnswerer,
    MalformedOutput,
    evidence_line,
)
from modules.lm.question_types import Decision, comparison_plan, rule_answer
from modules.lm.references import fill_references
from modules.retrieval.retriever import HypergraphRetriever, interleave_passages
from pipeline.config import ProgramConfig
from pipeline.files import read_json
from pipeline.scope import current

# What a small model gets wrong: unparseable output, the wrong shape, values that fail validation.
LM_FAILURES = (AdapterParseError, MalformedOutput, ValueError)


class HyperProve(dspy.Module):
    """Question -> answer and the evidence chain (per hop: sub-question, query, facts, answer)."""

    def __init__(self, retriever: HypergraphRetriever | None, config: ProgramConfig | None = None):
        """`retriever=None` gives the LM modules alone: enough to compile, save and load them."""
        super().__init__()
        self.config = config or ProgramConfig()
        self.decompose = Decomposer(comparisons=self.config.comparison_demos, facts=self.config.decompose_facts > 0)
        self.rewrite = BridgeRewriter()
        self.answer_hop = HopAnswerer()
        self.generate = AnswerGenerator()
        self.shape = QuestionShape()
        self.retriever = retriever

    def forward(self, question: str) -> dspy.Prediction:
        if self.retriever is None:
            raise HyperProveError("this HyperProve program has no retriever: it was built to compile or save its LM modules")
        config, fallbacks = self.config, []
        started = time.perf_counter()
        whole = self.retriever(question) if config.question_channel or config.decompose_facts else None
        retrieval_seconds = time.perf_counter() - started
        planned = comparison_plan(question) if config.comparison_plans else None
        facts = self.frontier_lines(whole.ranked_ids[: config.decompose_facts]) if config.decompose_facts else []
        documentation = config.documentation_demos and self.shape.documentation(question, self.retriever.encode)
        sub_questions = planned or self.sub_questions(question, fallbacks, facts, documentation)
        current().progress("plan", {"sub_questions": list(sub_questions)})

        frontier: list[int] = []
        answers: list[str] = []
        chain: list[dict] = []
        hop_passages: list[list[int]] = [whole.passages] if config.question_channel else []
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
            evidence = self.hop_evidence(hop)
            try:
                reading = self.answer_hop(question=query, facts=evidence, grounded=config.grounded_hops, grounded_in=config.grounded_in,
                                          countries=config.country_names, encode=self.retriever.encode, asked=question,
                                          documentation=documentation and config.documentation_hop_demos)
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
            current().progress("hop", chain[-1])

        passages = interleave_passages(hop_passages)
        decision, before_choice = self.answer_by_rule(question, chain, fallbacks), None
        if decision is not None:
            final = decision.answer
        else:
            try:
                reading = self.generate(question=question, evidence=self.reader_evidence(chain, frontier, passages), choose=config.choose_options,
                                        encode=self.retriever.encode)
                final, before_choice = reading.answer, reading.replaced
                if reading.replaced is not None:
                    fallbacks.append(reading.note)
            except LM_FAILURES as error:
                final = answers[-1]
                fallbacks.append(f"final answer: {error}")
        return dspy.Prediction(
            answer=final,
            answer_before_choice=before_choice,
            chain=chain,
            frontier=frontier,
            passages=passages,
            fallbacks=fallbacks,
            by_rule=decision.how if decision is not None else None,
            planned_by_rule=bool(planned),
            documentation=documentation,
            retrieval_seconds=retrieval_seconds,
        )

    def hop_evidence(self, hop: dspy.Prediction) -> list[ScoredFact]:
        """What the hop reader reads: the hop's top-K facts, then up to `hop_passage_facts` more
        of its top passage."""
        evidence = list(hop.facts)
        if self.config.hop_passage_facts and hop.passages:
            evidence += self.retriever.passage_facts(hop.passages[0], hop.query_vector, exclude=[fact.id for fact in hop.facts],
                                                     n=self.config.hop_passage_facts)
        return evidence

    def sub_questions(self, question: str, fallbacks: list[str], facts: list[str], documentation: bool = False) -> list[str]:
        """Step 4 by the LM (reading `facts` with `decompose_facts`; the documentation
        demonstrations shown with `documentation`), checked; one hop on the question itself when it fails."""
        config = self.config
        try:
            decomposition = self.decompose(question=question, max_hops=config.max_hops, entity_retries=config.entity_retries,
                                           encode=self.retriever.encode, facts=facts, documentation=documentation)
        except LM_FAILURES as error:
            fallbacks.append(f"decompose: {error}")
            return [question]
        if decomposition.problems:
            fallbacks.append(f"decompose: kept one that {', '.join(decomposition.problems)} after {decomposition.attempts} tries")
        return decomposition.sub_questions

    def answer_by_rule(self, question: str, chain: list[dict], fallbacks: list[str]) -> Decision | None:
        """The final answer a rule gives (`compare_by_rule`), else None: the reader answers. A
        comparison the rule cannot decide is noted in `fallbacks`."""
        if not self.config.compare_by_rule:
            return None
        decision = rule_answer(question, chain, both=self.config.both_by_rule)
        if decision is not None and decision.answer is None:
            fallbacks.append(f"compare: {decision.how}; the reader answers")
            return None
        return decision

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
PREDICTOR_STATE = {"demos", "signature", "traces", "train", "lm", "pool", "per_call", "by"}  # what our predictors' dump_state writes (`PooledPredict`)


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
        for key in ("demos", "pool"):
            examples = entry.get(key, [])
            if not isinstance(examples, list) or not all(isinstance(example, dict) and _json_value(example) for example in examples):
                raise refuse(f"{name}.{key}", "must be a list of objects of plain JSON values")
        per_call = entry.get("per_call", 0)
        if not isinstance(per_call, int) or isinstance(per_call, bool) or not 0 <= per_call <= MAX_PER_CALL:
            raise refuse(f"{name}.per_call", f"must be a whole number from 0 to {MAX_PER_CALL}")
        if entry.get("by", "call") not in BY:
            raise refuse(f"{name}.by", f"must be one of {', '.join(BY)}")
        signature = entry.get("signature", own[name]["signature"])
        fields = signature.get("fields") if isinstance(signature, dict) else None
        if (not isinstance(signature, dict) or set(signature) - {"instructions", "fields"} or not isinstance(signature.get("instructions"), str)
                or not isinstance(fields, list) or len(fields) != len(own[name]["signature"]["fields"])
                or not all(isinstance(f, dict) and set(f) == {"prefix", "description"} and all(isinstance(v, str) for v in f.values()) for f in fields)):
            raise refuse(f"{name}.signature", "must hold the instructions (text) and, per field of the predictor, its prefix and description (texts)")
        checked[name] = {"traces": [], "train": [], "demos": entry.get("demos", []), "signature": signature, "lm": None,
                         "pool": entry.get("pool", []), "per_call": per_call, "by": entry.get("by", "call")}
    return checked


def load_compiled(module: dspy.Module, path: str | None) -> dspy.Module:
    """Load a compiled program's state into `module` (a HyperProve, or a reader sharing its final
    predictor); nothing to do without a path. Only what `program_state` accepts is loaded. A
    predictor the file does not hold (a program compiled before that predictor existed) keeps
    its built-in demonstrations."""
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
