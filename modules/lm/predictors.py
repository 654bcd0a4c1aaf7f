"""The LM modules, one per step of METHOD.md that the LM does: one predictor each, with its
built-in demonstrations (`modules.lm.demos`) and its output checked by rule (`modules.lm.checks`).

All predictors are visible to `named_predictors()`, so an optimizer (`hyperprove compile`) can
replace their demonstrations. Each module checks what comes back and raises `MalformedOutput`
when it is unusable, so the caller decides the fallback (METHOD.md names none; the program
documents its own).
"""


from __future__ import annotations

from typing import Sequence

import dspy
from dspy.utils.exceptions import AdapterParseError

from modules.errors import HyperProveError
from modules.facts import ScoredFact
from modules.lm.checks import (
    answer_kind,
    contained,
    content_words,
    entity_budget,
    entity_problems,
    extraction_budget,
    fact_grounded,
    mentioned,
    names_an_option,
    question_options,
    single_spaced,
    supported_entities,
    supported_span,
)
from modules.lm.demos import (
    ANSWER_HOP_DEMOS,
    CHOOSE_DEMOS,
    COMPARISON_DEMOS,
    DECOMPOSE_DEMOS,
    DOC_ANSWER_HOP_DEMOS,
    DOC_COMPARISON_DEMOS,
    DOC_DECOMPOSE_DEMOS,
    DOC_DECOMPOSE_FACTS,
    ENTITY_DEMOS,
    EXTRACT_DEMOS,
    GENERATE_DEMOS,
    REWRITE_DEMOS,
    with_facts,
)
from modules.lm.pool import Encode, PooledPredict
from modules.lm.references import REFERENCE, fill_references, references
from modules.lm.signatures import (
    FACTS_FIELD,
    FACTS_NOTE,
    AnswerHop,
    ChooseAnswer,
    Decompose,
    DecomposeComparisons,
    ExtractedFact,
    ExtractEntities,
    ExtractFacts,
    GenerateAnswer,
    RewriteBridge,
)


class MalformedOutput(HyperProveError):
    """The LM answered, but not in a usable shape."""


def _predictor(signature, demos: list[dspy.Example]) -> PooledPredict:
    return PooledPredict(signature, demos)


def past_cache(attempt: int, temperature: float) -> dict:
    """LM call settings for asking again: attempt k > 0 is its own cache entry (`rollout_id`),
    sampled warmer with the seed k, so that the same retry draws the same sample on a server
    that honours a request's seed (the embedded llama.cpp does); attempt 0 is the plain call."""
    return {"rollout_id": attempt, "temperature": temperature, "seed": attempt} if attempt else {}


# --- the modules ---------------------------------------------------------------------------------
class FactExtractor(dspy.Module):
    """Step 1: passage -> entities and atomic facts, each fact with the entities it mentions.

    The LM names the passage's entities once and writes the facts; a fact's entities are the
    listed ones it mentions (case-insensitive). Not repeating the entities under every fact
    roughly halves the tokens a small local model has to generate.

    Only what the passage supports is kept: a fact most of whose content words are not in the
    title or passage, or an entity with such a word, is dropped. A 1.5B model sometimes copies
    a demonstration's facts ("Leah Adler was born ...") into the answer for an unrelated passage.
    """

    def __init__(self):
        super().__init__()
        self.extract = _predictor(ExtractFacts, EXTRACT_DEMOS)

    def forward(self, title: str, passage: str, attempt: int = 0) -> dspy.Prediction:
        """attempt > 0 asks again past the cache, a little warmer, after a malformed answer."""
        config = {"max_tokens": extraction_budget(title, passage), **past_cache(attempt, temperature=0.3)}
        output = self.extract(title=title, passage=passage, config=config)
        source = content_words(f"{title} {passage}")
        entities = supported_entities(output.entities, source)
        texts = list(dict.fromkeys(t for t in (single_spaced(t) for t in output.facts or []) if t and fact_grounded(t, source)))
        if not texts:
            raise MalformedOutput(f"no facts extracted from passage {title!r} that the passage supports")
        facts = [ExtractedFact(text=text, entities=mentioned(entities, text)) for text in texts]
        return dspy.Prediction(entities=entities, facts=facts)


class EntityExtractor(dspy.Module):
    """Step 1's entities alone: passage -> the entities it mentions; the facts are its sentences,
    split by rule (`pipeline.index.extract.LMEntityExtractor`). Less than half of `FactExtractor`'s
    generated tokens (61 against 152 a MuSiQue passage), which are what an LM call costs on a
    laptop CPU. An entity with a word that is not in the title or passage is dropped, as in
    `FactExtractor`."""

    def __init__(self):
        super().__init__()
        self.extract = _predictor(ExtractEntities, ENTITY_DEMOS)

    def forward(self, title: str, passage: str, attempt: int = 0) -> dspy.Prediction:
        """attempt > 0 asks again past the cache, a little warmer, after a malformed answer."""
        config = {"max_tokens": entity_budget(title, passage), **past_cache(attempt, temperature=0.3)}
        output = self.extract(title=title, passage=passage, config=config)
        entities = supported_entities(output.entities, content_words(f"{title} {passage}"))
        if not entities:
            raise MalformedOutput(f"no entities extracted from passage {title!r} that the passage supports")
        return dspy.Prediction(entities=entities)


class Decomposer(dspy.Module):
    """Step 4: question -> ordered sub-questions with "#k" references to earlier answers.

    With `comparisons`, two more demonstrations show comparisons (one sub-question per compared
    thing) and the instructions ask to keep the question's names (`DecomposeComparisons`).

    With `entity_retries`, a decomposition that drops or invents a named word of the question
    (`entity_problems`) is asked for again, warmer and past the cache, up to that many times; the
    first clean one wins, else the one with the fewest problems (the first among equals).

    With `facts`, the decomposer also reads facts found for the whole question, so that its
    sub-questions name the entities as the corpus does (its demonstrations show facts too).

    A question about a software manual (`documentation=True` in `forward`) is shown the
    documentation demonstrations, of the same kinds (`modules.lm.demos.DOC_*`), instead of its
    own (built-in or compiled).
    """

    def __init__(self, comparisons: bool = False, facts: bool = False):
        super().__init__()
        signature, demos = (DecomposeComparisons, DECOMPOSE_DEMOS + COMPARISON_DEMOS) if comparisons else (Decompose, DECOMPOSE_DEMOS)
        documentation = DOC_DECOMPOSE_DEMOS + (DOC_COMPARISON_DEMOS if comparisons else [])
        if facts:
            signature = signature.append("facts", FACTS_FIELD, list[str]).with_instructions(f"{signature.instructions} {FACTS_NOTE}")
            demos = with_facts(demos)
            documentation = with_facts(documentation, DOC_DECOMPOSE_FACTS)
        self.reads_facts = facts
        self.documentation_demos = documentation
        self.decompose = _predictor(signature, demos)

    def forward(self, question: str, max_hops: int = 4, entity_retries: int = 0, encode: Encode | None = None,
                facts: Sequence[str] = (), documentation: bool = False) -> dspy.Prediction:
        """`encode` chooses the demonstrations of a compiled pool (`modules.lm.pool`) for this
        question; `facts` are what a decomposer built with `facts` reads beside it."""
        tried: list[tuple[int, int, list[str], list[str]]] = []
        failure: Exception | None = None
        shown = {"demos": self.documentation_demos} if documentation else {}
        for attempt in range(entity_retries + 1):
            config = past_cache(attempt, temperature=0.7)
            try:
                sub_questions = self.sub_questions(question, max_hops, config, encode, facts, **shown)
            except (MalformedOutput, ValueError) as error:  # a retry may still give a usable one
                if not entity_retries:
                    raise
                failure = failure or error
                continue
            problems = entity_problems(question, sub_questions) if entity_retries else []
            if not problems:
                return dspy.Prediction(sub_questions=sub_questions, problems=[], attempts=attempt + 1)
            tried.append((len(problems), attempt, sub_questions, problems))
        if not tried:
            raise failure
        _, _, sub_questions, problems = min(tried)
        return dspy.Prediction(sub_questions=sub_questions, problems=problems, attempts=entity_retries + 1)

    def sub_questions(self, question: str, max_hops: int, config: dict, encode: Encode | None = None, facts: Sequence[str] = (),
                      **demos) -> list[str]:
        read = {"facts": list(facts)} if self.reads_facts else {}
        read.update(demos)
        output = self.decompose(question=question, config=config, encode=encode, **read)
        sub_questions = [single_spaced(q) for q in output.sub_questions or []]
        sub_questions = [q for q in sub_questions if q]
        if not sub_questions:
            raise MalformedOutput("the decomposition is empty")
        if len(sub_questions) > max_hops:
            raise MalformedOutput(f"the decomposition has {len(sub_questions)} hops, more than {max_hops}")
        for position, sub_question in enumerate(sub_questions, start=1):
            if any(not 1 <= k < position for k in references(sub_question)):
                raise MalformedOutput(f"sub-question {position} refers to an answer not yet known: {sub_question!r}")
        return sub_questions


class BridgeRewriter(dspy.Module):
    """Step 5: a sub-question with "#k" -> a standalone query naming the resolved answers.

    Without references there is nothing to rewrite and no LM call is made; with `by_rule`, each
    "#k" is replaced by its answer and no LM call is made either (`fill_references`).
    """

    def __init__(self):
        super().__init__()
        self.rewrite = _predictor(RewriteBridge, REWRITE_DEMOS)

    def forward(self, sub_question: str, answers: Sequence[str], by_rule: bool = False) -> dspy.Prediction:
        used = sorted(set(references(sub_question)))
        if not used:
            return dspy.Prediction(query=sub_question, rewritten=False)
        if by_rule:
            return dspy.Prediction(query=fill_references(sub_question, answers), rewritten=True)
        resolved = [f"#{k} = {answers[k - 1]}" for k in used if 1 <= k <= len(answers)]
        query = single_spaced(self.rewrite(sub_question=sub_question, resolved=resolved).question)
        if not query or REFERENCE.search(query):
            raise MalformedOutput(f"the rewrite of {sub_question!r} still has a reference or is empty: {query!r}")
        missing = [answers[k - 1] for k in used if 1 <= k <= len(answers) and answers[k - 1].lower() not in query.lower()]
        if missing:
            raise MalformedOutput(f"the rewrite {query!r} drops the resolved answer {missing[0]!r}")
        return dspy.Prediction(query=query, rewritten=True)


EVIDENCE_PASSAGES = 5  # the passages a reader sees: every peer's top 5, and the program's


def evidence_line(title: str, text: str) -> str:
    """How a fact or passage is shown to a reader: "(title) text", as in the demonstrations."""
    return f"({title}) {text}"


def numbered_evidence(facts: Sequence[ScoredFact]) -> list[str]:
    return [f"[{n}] {evidence_line(fact.title, fact.text)}" for n, fact in enumerate(facts, start=1)]


class HopAnswerer(dspy.Module):
    """Step 10: a hop's query and evidence facts -> short answer and the supporting facts.

    With `grounded`, an answer that the cited facts (all evidence facts when none is cited) do
    not contain is asked for once more past the cache; if that one is not contained either, the
    answer becomes the first span of those facts, of the kind the hop asks for (a date, a
    number or a name), that the query does not name; with no such span the answer stays (`ungrounded`). One
    invented bridge would otherwise send every later hop after the wrong entity. With
    `grounded_in="evidence"`, an answer that another of the hop's facts contains is kept, and
    its support becomes those facts: a small model often cites the wrong number for a right answer.

    With `countries`, an answer whose countries the facts name by other words ("Austria" for "an
    Austrian composer") counts as contained.

    A hop of a question about a software manual (`documentation=True`) is shown the documentation
    demonstrations, which answer with the whole span the fact gives (a flag, a variable, a clause).
    """

    def __init__(self):
        super().__init__()
        self.answer = _predictor(AnswerHop, ANSWER_HOP_DEMOS)

    def forward(self, question: str, facts: Sequence[ScoredFact], grounded: bool = False, grounded_in: str = "cited",
                countries: bool = False, encode: Encode | None = None, asked: str | None = None,
                documentation: bool = False) -> dspy.Prediction:
        """`encode` chooses the demonstrations of a compiled pool (`modules.lm.pool`) for this hop,
        by the hop or by `asked`, the question the program was asked."""
        evidence = numbered_evidence(facts)
        shown = {"demos": DOC_ANSWER_HOP_DEMOS} if documentation else {}
        for attempt in range(2 if grounded else 1):
            config = past_cache(attempt, temperature=0.7)
            output = self.answer(question=question, evidence=evidence, config=config, encode=encode, asked=asked, **shown)
            answer = single_spaced(output.answer)
            if not answer:
                raise MalformedOutput(f"no answer to {question!r}")
            supporting = [facts[n - 1] for n in dict.fromkeys(output.supporting or []) if 1 <= n <= len(facts)]
            cited = supporting or list(facts)
            resting = cited if not grounded or contained(answer, [f"{fact.title} {fact.text}" for fact in cited], countries) else None
            if resting is None and grounded_in == "evidence":
                resting = [fact for fact in facts if contained(answer, [f"{fact.title} {fact.text}"], countries)] or None
            if resting is not None:
                kept = supporting if resting is cited else resting
                return dspy.Prediction(answer=answer, supporting=[fact.id for fact in kept], replaced=None, ungrounded=False, why=None,
                                       kind=answer_kind(question, answer))
            problem = "is not in the facts it cites" if supporting and grounded_in == "cited" else "is not in its facts"
        span = supported_span(question, cited, answer)
        return dspy.Prediction(answer=span or answer, supporting=[fact.id for fact in supporting], replaced=answer if span else None,
                               ungrounded=span is None, why=problem, kind=answer_kind(question, answer))


class AnswerGenerator(dspy.Module):
    """Step 11: the question and the evidence chain -> the final short answer.

    With `choose`, an answer to a question that names its options ("..., Jaws or Duel?") that is
    none of them (the director found on the way, "No" to "Is A or B further west?") is asked for
    once more as a choice between the options (`ChooseAnswer`); a reply that is no option either,
    or does not parse, leaves the first answer. The options come from the question by rule
    (`question_options`), so no other question pays for the check. A chosen answer comes with the
    one it `replaced` and the fallback `note` that says so.
    """

    def __init__(self):
        super().__init__()
        self.generate = _predictor(GenerateAnswer, GENERATE_DEMOS)
        self.choose = _predictor(ChooseAnswer, CHOOSE_DEMOS)

    def forward(self, question: str, evidence: Sequence[str], choose: bool = False, encode: Encode | None = None) -> dspy.Prediction:
        """`encode` chooses the demonstrations of a compiled pool (`modules.lm.pool`) for this question."""
        answer = single_spaced(self.generate(question=question, evidence=list(evidence), encode=encode, asked=question).answer)
        if not answer:
            raise MalformedOutput(f"no final answer to {question!r}")
        options = question_options(question) if choose else []
        if not options or names_an_option(answer, options):
            return dspy.Prediction(answer=answer, replaced=None)
        try:
            chosen = single_spaced(self.choose(question=question, options=options, evidence=list(evidence)).answer)
        except (AdapterParseError, ValueError):
            chosen = ""
        if names_an_option(chosen, options):
            note = f"final answer: {answer!r} is none of the question's options; the reader chose {chosen!r}"
            return dspy.Prediction(answer=chosen, replaced=answer, note=note)
        return dspy.Prediction(answer=answer, replaced=None)
