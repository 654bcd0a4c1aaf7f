"""The LM steps as DSPy modules: one predictor each, built-in demonstrations, checked output.

A 1.5B local model follows these signatures only with examples in front of it, so every
predictor ships one or two hand-written demonstrations (about one invented film, not taken from
any benchmark). An optimizer (`hyperprove compile`) replaces them; all predictors are visible to
`named_predictors()`. Each module checks what comes back and raises `MalformedOutput` when it is
unusable, so the caller decides the fallback (METHOD.md names none; the program documents its own).
"""

from __future__ import annotations

import re
from typing import Sequence

import dspy
from dspy.utils.exceptions import AdapterParseError

from modules.errors import HyperProveError
from modules.facts import ScoredFact
from modules.references import REFERENCE, fill_references, references
from modules.signatures import (
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


# --- built-in demonstrations ---------------------------------------------------------------------
_JAWS = (
    "Jaws is a 1975 American thriller film directed by Steven Spielberg. It is based on the 1974 "
    "novel by Peter Benchley. The film was a box-office success."
)
_ADLER = (
    "Leah Adler (January 12, 1920 - February 21, 2017) was an American restaurateur and pianist. "
    "She was the mother of the film director Steven Spielberg. She owned The Milky Way, a kosher "
    "restaurant in Los Angeles."
)
EXTRACT_DEMOS = [
    dspy.Example(
        title="Jaws (film)",
        passage=_JAWS,
        entities=["Jaws", "1975", "Steven Spielberg", "1974", "Peter Benchley"],
        facts=[
            "Jaws is a 1975 American thriller film.",
            "Jaws was directed by Steven Spielberg.",
            "Jaws is based on the 1974 novel by Peter Benchley.",
            "Jaws was a box-office success.",
        ],
    ).with_inputs("title", "passage"),
    dspy.Example(
        title="Leah Adler",
        passage=_ADLER,
        entities=["Leah Adler", "January 12, 1920", "February 21, 2017", "Steven Spielberg", "The Milky Way", "Los Angeles"],
        facts=[
            "Leah Adler was born on January 12, 1920.",
            "Leah Adler died on February 21, 2017.",
            "Leah Adler was an American restaurateur and pianist.",
            "Leah Adler was the mother of the film director Steven Spielberg.",
            "Leah Adler owned The Milky Way, a kosher restaurant in Los Angeles.",
        ],
    ).with_inputs("title", "passage"),
]
ENTITY_DEMOS = [dspy.Example(title=d.title, passage=d.passage, entities=d.entities).with_inputs("title", "passage") for d in EXTRACT_DEMOS]
DECOMPOSE_DEMOS = [
    dspy.Example(
        question="When did the director of Jaws' mother die?",
        sub_questions=["Who directed Jaws?", "Who is the mother of #1?", "When did #2 die?"],
    ).with_inputs("question"),
    dspy.Example(
        question="Where was the wife of the person that the Spielberg Prize is named after born?",
        sub_questions=["Who is the Spielberg Prize named after?", "Who is the wife of #1?", "Where was #2 born?"],
    ).with_inputs("question"),
]
# comparisons: one sub-question per compared thing, each naming it; the final reader compares
COMPARISON_DEMOS = [
    dspy.Example(
        question="Which film came out first, Jaws or Close Encounters of the Third Kind?",
        sub_questions=["When did Jaws come out?", "When did Close Encounters of the Third Kind come out?"],
    ).with_inputs("question"),
    dspy.Example(
        question="Are the directors of Jaws and Duel from the same country?",
        sub_questions=["Who directed Jaws?", "Who directed Duel?", "What country is #1 from?", "What country is #2 from?"],
    ).with_inputs("question"),
]
REWRITE_DEMOS = [
    dspy.Example(
        sub_question="Who is the mother of #1?", resolved=["#1 = Steven Spielberg"], question="Who is the mother of Steven Spielberg?"
    ).with_inputs("sub_question", "resolved"),
    dspy.Example(
        sub_question="When did #2 die?", resolved=["#1 = Steven Spielberg", "#2 = Leah Adler"], question="When did Leah Adler die?"
    ).with_inputs("sub_question", "resolved"),
]
ANSWER_HOP_DEMOS = [
    dspy.Example(
        question="Who directed Jaws?",
        evidence=[
            "[1] (Jaws (film)) Jaws is a 1975 American thriller film.",
            "[2] (Jaws (film)) Jaws was directed by Steven Spielberg.",
            "[3] (Jaws (film)) Jaws is based on the 1974 novel by Peter Benchley.",
        ],
        answer="Steven Spielberg",
        supporting=[2],
    ).with_inputs("question", "evidence"),
    dspy.Example(
        question="When did Leah Adler die?",
        evidence=[
            "[1] (Leah Adler) Leah Adler was born on January 12, 1920.",
            "[2] (Leah Adler) Leah Adler was the mother of the film director Steven Spielberg.",
            "[3] (Leah Adler) Leah Adler died on February 21, 2017.",
        ],
        answer="February 21, 2017",
        supporting=[3],
    ).with_inputs("question", "evidence"),
]
GENERATE_DEMOS = [
    dspy.Example(
        question="When did the director of Jaws' mother die?",
        evidence=[
            "Who directed Jaws? -> Steven Spielberg",
            "Who is the mother of Steven Spielberg? -> Leah Adler",
            "When did Leah Adler die? -> February 21, 2017",
            "(Jaws (film)) Jaws was directed by Steven Spielberg.",
            "(Leah Adler) Leah Adler was the mother of the film director Steven Spielberg.",
            "(Leah Adler) Leah Adler died on February 21, 2017.",
        ],
        answer="February 21, 2017",
    ).with_inputs("question", "evidence"),
    dspy.Example(
        question="In which city is the restaurant owned by the mother of the director of Jaws?",
        evidence=[f"(Jaws (film)) {_JAWS}", f"(Leah Adler) {_ADLER}"],
        answer="Los Angeles",
    ).with_inputs("question", "evidence"),
]


# a question that names its options: the reader picks the one the evidence supports
CHOOSE_DEMOS = [
    dspy.Example(
        question="Which film came out first, Jaws or Close Encounters of the Third Kind?",
        options=["Jaws", "Close Encounters of the Third Kind"],
        evidence=[
            "When did Jaws come out? -> 1975",
            "When did Close Encounters of the Third Kind come out? -> 1977",
            "(Jaws (film)) Jaws is a 1975 American thriller film.",
            "(Close Encounters of the Third Kind) Close Encounters of the Third Kind is a 1977 science fiction film.",
        ],
        answer="Jaws",
    ).with_inputs("question", "options", "evidence"),
    dspy.Example(
        question="Who was born first, Steven Spielberg or Leah Adler?",
        options=["Steven Spielberg", "Leah Adler"],
        evidence=[
            "When was Steven Spielberg born? -> December 18, 1946",
            "When was Leah Adler born? -> January 12, 1920",
            "(Leah Adler) Leah Adler was born on January 12, 1920.",
            "(Leah Adler) Leah Adler was the mother of the film director Steven Spielberg.",
        ],
        answer="Leah Adler",
    ).with_inputs("question", "options", "evidence"),
]


def _predictor(signature, demos: list[dspy.Example]) -> dspy.Predict:
    predictor = dspy.Predict(signature)
    predictor.demos = list(demos)
    return predictor


def past_cache(attempt: int, temperature: float) -> dict:
    """LM call settings for asking again: attempt k > 0 is its own cache entry (`rollout_id`),
    sampled warmer; attempt 0 is the plain, cached call."""
    return {"rollout_id": attempt, "temperature": temperature} if attempt else {}


def _short(text: object) -> str:
    return " ".join(str(text or "").split()).strip()


# --- checks on what the LM wrote -----------------------------------------------------------------
_STOPWORDS = frozenset(
    "the a an and or of in on at to for by with from as is was were are be been has had have it its his her "
    "their he she they this that which who whom also not but into after before during".split()
)
GROUNDED_SHARE = 0.6  # of a fact's content words that must occur in its passage


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if w not in _STOPWORDS}


def _supported(entity: str, source: set[str]) -> bool:
    words = _content_words(entity)
    return bool(words) and words <= source


def supported_entities(listed, source: set[str]) -> list[str]:
    """The listed entities whose words the source has, each once, whitespace normalised."""
    return list(dict.fromkeys(e for e in (_short(e) for e in listed or []) if _supported(e, source)))


def _grounded(fact: str, source: set[str]) -> bool:
    words = _content_words(fact)
    return bool(words) and len(words & source) >= GROUNDED_SHARE * len(words)


def entity_budget(title: str, passage: str) -> int:
    """Output tokens for one passage's entities: about a third of the passage, as a list of names
    is much shorter than the facts (`extraction_budget`)."""
    return min(384, 48 + len(title + passage) // 12)


def extraction_budget(title: str, passage: str) -> int:
    """Output tokens for one passage's facts and entities: about twice the passage (a token is
    about 4 characters), so a small model that starts repeating itself stops early instead of
    filling 1,024 tokens (2-3 minutes on 2 cores) before the retry."""
    return min(1024, 96 + len(title + passage) // 2)


# Words that open questions or join names: capitalised at the start of a question, never a name.
_FUNCTION_WORDS = _STOPWORDS | frozenset(
    "what when where which why how whose do does did can could would will shall should may might must there "
    "name named same both either neither first last".split()
)
_WORD = re.compile(r"\w+")
_JOINERS = frozenset("of de del della da das do dos du di von van der den la le les el y and the".split())


def lower_words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def named_words(text: str, skip_first: bool = False) -> set[str]:
    """The words that name something (lower-cased): capitalised ones other than question and
    function words and single letters, and numbers. "#k" references are not names. With
    `skip_first`, a first word capitalised only because it starts the sentence does not count."""
    words = _WORD.findall(REFERENCE.sub(" ", text))
    if skip_first and words and not words[0][0].isdigit():
        words = words[1:]
    return {w.lower() for w in words if (w[0].isupper() and len(w) > 1 or w[0].isdigit()) and w.lower() not in _FUNCTION_WORDS}


def entity_problems(question: str, sub_questions: Sequence[str]) -> list[str]:
    """What a decomposition gets wrong about the question's names, by rule: a named word of the
    question no sub-question has ("drops 'jaws'"), or a named word no part of the question has
    ("invents '1975'"). A 1.5B decomposer does both, and a chain that starts from the wrong
    entity cannot recover. Words in brackets ("Inherent Vice (Film)") may be left out."""
    asked = lower_words(question)
    written = set().union(*(lower_words(REFERENCE.sub(" ", q)) for q in sub_questions))
    dropped = sorted(named_words(re.sub(r"\([^()]*\)", " ", question), skip_first=True) - written)
    invented = sorted(set().union(*(named_words(q, skip_first=True) for q in sub_questions)) - asked)
    return [f"drops {w!r}" for w in dropped] + [f"invents {w!r}" for w in invented]


def contained(answer: str, texts: Sequence[str]) -> bool:
    """Whether the texts contain the answer: all its content words (yes/no always counts)."""
    words = _content_words(answer)
    if not words or words <= {"yes", "no"}:
        return True
    return words <= _content_words(" ".join(texts))


def named_spans(text: str) -> list[str]:
    """Runs of capitalised words and numbers ("Steven Spielberg", "February 21, 2017", "Duke of
    York"), in order; lower-case joiners ("of", "de", "van") may sit inside a run."""
    spans, run, pending = [], [], []
    for match in re.finditer(r"\w+(?:['’.-]\w+)*|,", text):
        token = match.group()
        if token[0].isupper() or token[0].isdigit():
            run += pending + [token]
            pending = []
        elif run and (token.lower() in _JOINERS or token == ","):
            pending.append(token)
        else:
            if run:
                spans.append(run)
            run, pending = [], []
    if run:
        spans.append(run)
    return [" ".join(run).replace(" ,", ",") for run in spans]


# A date ("21 February 2017", "February 21, 2017", "May 3", a year of 3-4 digits that is no part of
# a longer number) and a number ("12,000", "3.5"): the spans a "when" and a "how many" hop take.
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
DATE = re.compile(rf"\b(?:\d{{1,2}} )?{_MONTH}(?: \d{{1,2}})?,? \d{{3,4}}\b|\b{_MONTH} \d{{1,2}}\b|(?<![\w,.])\d{{3,4}}(?![\w]|[,.]\d)")
NUMBER = re.compile(r"(?<![\w,.])\d+(?:[.,]\d+)*(?!\w|[.,]\d)")
_ASKS_DATE = re.compile(r"^\W*when\b|\b(?:what|which) (?:year|date|day|month|century)\b|\b(?:date|year) of\b", re.IGNORECASE)
_ASKS_NUMBER = re.compile(r"\bhow (?:many|much|long|old|tall|far|big|large|high)\b|\b(?:age|population)\b", re.IGNORECASE)


def answer_kind(query: str, answer: str = "") -> str:
    """What a hop asks for: "date" (its query asks when or what year, or the reader answered a
    date), "number" (how many, how old, ...; or a number answered), else "name"."""
    answer = answer.strip()
    if _ASKS_DATE.search(query) or DATE.fullmatch(answer):
        return "date"
    if _ASKS_NUMBER.search(query) or NUMBER.match(answer):
        return "number"
    return "name"


_EDGES = _JOINERS | {","}  # what a cut span must not begin or end with


def _name_part(span: str) -> str:
    """A named span with its dates cut out, no joiner or comma left at either end; "" when no
    letter is left ("12,000")."""
    words = re.sub(r",(?:\s*,)+", ",", DATE.sub(",", span)).replace(",", " , ").split()
    while words and words[0].lower() in _EDGES:
        words = words[1:]
    while words and words[-1].lower() in _EDGES:
        words = words[:-1]
    name = " ".join(words).replace(" ,", ",")
    return name if re.search(r"[^\W\d_]", name) else ""


def _spans(text: str, kind: str) -> list[str]:
    if kind == "date":
        return [match.group() for match in DATE.finditer(text)]
    if kind == "number":
        return [match.group() for match in NUMBER.finditer(DATE.sub(" ", text))]
    return [_name_part(span) for span in named_spans(text)]


def supported_span(query: str, facts: Sequence[ScoredFact], answer: str = "") -> str | None:
    """The first span of the facts, in their order, of the kind the hop asks for
    (`answer_kind`), that the query does not already name: the answer a hop's evidence best
    supports when the reader's `answer` is not in it. A "When did #1 die?" never gets a city
    back, and a "Who ...?" never a year ("Marie Méliès 8 December 1861" -> "Marie Méliès").
    None when the facts hold no span of that kind."""
    asked = lower_words(query)
    kind = answer_kind(query, answer)
    for fact in facts:
        for span in _spans(fact.text, kind):
            if named_words(span) - asked:
                return span
    return None


_IDENTITY = re.compile(r"^\s*(?:who|what)\s+(?:is|was|are|were)\s+(?P<name>[^#?]+?)\s*\?\s*$", re.IGNORECASE)


def identity_name(sub_question: str, question: str) -> str | None:
    """The name a sub-question only asks to identify ("Who is Max Cavalera?" -> "Max Cavalera"),
    when the question names it as written; else None. Such a hop answers with the name it was
    given. A description ("Who is the King of Hollywood?") is a real bridge and no identity."""
    match = _IDENTITY.match(sub_question)
    if not match:
        return None
    name = match.group("name")
    words = name.split()
    proper = words[0][0].isupper() and words[0].lower() not in _FUNCTION_WORDS
    if not proper or not all(w[0].isupper() or w[0].isdigit() or w.lower() in _JOINERS for w in words):
        return None
    return name if name.lower() in question.lower() else None


def fold_identities(question: str, sub_questions: Sequence[str]) -> tuple[list[str], list[str]]:
    """The decomposition without its identity steps (`identity_name`), and the steps dropped: each
    "#k" that referred to one becomes the name itself, the other references are renumbered. A
    decomposition of nothing but identities is left as it is (nothing dropped). This saves the identity's hop answer and the rewrite of the
    step that refers to it, but the identity hop's facts also seed the next hop's frontier, which
    on 2Wiki train found dates the folded step missed (README: the option stays off)."""
    names = {k: identity_name(sub, question) for k, sub in enumerate(sub_questions, start=1)}
    if all(names.values()) or not any(names.values()):
        return list(sub_questions), []
    renumbered = {k: n for n, k in enumerate((k for k, name in names.items() if not name), start=1)}

    def refer(match: re.Match) -> str:
        k = int(match.group(1))
        return names.get(k) or (f"#{renumbered[k]}" if k in renumbered else match.group())

    kept = [REFERENCE.sub(refer, sub) for k, sub in enumerate(sub_questions, start=1) if not names[k]]
    return kept, [sub for k, sub in enumerate(sub_questions, start=1) if names[k]]


# Words that make "A or B" a choice between two names rather than part of a title ("Dead or Alive").
_COMPARING = frozenset(
    "first last earlier earliest later latest older oldest younger youngest longer longest shorter shortest taller "
    "tallest higher highest lower lowest bigger biggest larger largest smaller smallest further farther closer nearer "
    "more most less least fewer greater before after".split()
)
_CHOOSING = frozenset("which who whose is are was were do does did has have had".split())  # openings of a choice question
_MOST_OPTION_WORDS = 16  # 2Wiki has film titles of 14 words


def question_options(question: str) -> list[str]:
    """The answers a question names as its options, else []: "Which film came out first, Jaws or
    Duel?" and "Who played in Soulfly, Max Cavalera or Billy Idol?" (after the last comma or colon,
    in a question opening with which/who/is/... or comparing); in a comparing question also "Is
    Muskegon County Airport or John Wayne Airport further west?" (two named spans around "or") and
    "Who was born first out of A and B?".
    A title with "or" in it ("Who directed Dead or Alive?") is no choice."""
    text = question.strip().rstrip("?").strip()
    comparing = bool(lower_words(text) & _COMPARING)
    between = re.search(r"\b(?:out of|between) (.+) and (.+)$", text)
    head, joined, right = text.rpartition(" or ")
    clause = re.split(r"[,:;]", head)[-1]
    if comparing and between and not joined:  # "Who was born first out of A and B?"
        options = list(between.groups())
    elif not joined:
        return []
    elif clause != head and (comparing or text.split()[0].lower() in _CHOOSING):
        options = [clause, right]
    elif comparing:
        before, after = named_spans(head), named_spans(right)
        if not before or not after or not head.endswith(before[-1]) or not right.startswith(after[0]):
            return []
        named = before[-1].split()
        while named and named[0].lower() in _FUNCTION_WORDS:  # "Is Muskegon County Airport" -> "Muskegon County Airport"
            named = named[1:]
        options = [" ".join(named), after[0]]
    else:
        return []
    options = [option.strip(" \"'“”‘’") for option in options]
    if any(not _content_words(o) or len(o.split()) > _MOST_OPTION_WORDS for o in options) or _content_words(options[0]) == _content_words(options[1]):
        return []
    return options


def names_an_option(answer: str, options: Sequence[str]) -> bool:
    """Whether the answer is one of the options: its content words within an option's, or an
    option's within its own ("Tea Moderna (magazine)")."""
    words = _content_words(answer)
    return bool(words) and any(words <= _content_words(o) or _content_words(o) <= words for o in options)


def mentioned(entities: Sequence[str], text: str) -> list[str]:
    """The entities whose name occurs in the text (case-insensitive, on word boundaries)."""
    lowered = text.lower()
    return [e for e in entities if re.search(rf"(?<!\w){re.escape(e.lower())}(?!\w)", lowered)]


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
        source = _content_words(f"{title} {passage}")
        entities = supported_entities(output.entities, source)
        texts = list(dict.fromkeys(t for t in (_short(t) for t in output.facts or []) if t and _grounded(t, source)))
        if not texts:
            raise MalformedOutput(f"no facts extracted from passage {title!r} that the passage supports")
        facts = [ExtractedFact(text=text, entities=mentioned(entities, text)) for text in texts]
        return dspy.Prediction(entities=entities, facts=facts)


class EntityExtractor(dspy.Module):
    """Step 1's entities alone: passage -> the entities it mentions; the facts are its sentences,
    split by rule (`pipeline.extract.LMEntityExtractor`). Less than half of `FactExtractor`'s
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
        entities = supported_entities(output.entities, _content_words(f"{title} {passage}"))
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
    """

    def __init__(self, comparisons: bool = False):
        super().__init__()
        if comparisons:
            self.decompose = _predictor(DecomposeComparisons, DECOMPOSE_DEMOS + COMPARISON_DEMOS)
        else:
            self.decompose = _predictor(Decompose, DECOMPOSE_DEMOS)

    def forward(self, question: str, max_hops: int = 4, entity_retries: int = 0) -> dspy.Prediction:
        tried: list[tuple[int, int, list[str], list[str]]] = []
        failure: Exception | None = None
        for attempt in range(entity_retries + 1):
            config = past_cache(attempt, temperature=0.7)
            try:
                sub_questions = self.sub_questions(question, max_hops, config)
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

    def sub_questions(self, question: str, max_hops: int, config: dict) -> list[str]:
        sub_questions = [_short(q) for q in self.decompose(question=question, config=config).sub_questions or []]
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
        query = _short(self.rewrite(sub_question=sub_question, resolved=resolved).question)
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
    """

    def __init__(self):
        super().__init__()
        self.answer = _predictor(AnswerHop, ANSWER_HOP_DEMOS)

    def forward(self, question: str, facts: Sequence[ScoredFact], grounded: bool = False, grounded_in: str = "cited") -> dspy.Prediction:
        evidence = numbered_evidence(facts)
        for attempt in range(2 if grounded else 1):
            config = past_cache(attempt, temperature=0.7)
            output = self.answer(question=question, evidence=evidence, config=config)
            answer = _short(output.answer)
            if not answer:
                raise MalformedOutput(f"no answer to {question!r}")
            supporting = [facts[n - 1] for n in dict.fromkeys(output.supporting or []) if 1 <= n <= len(facts)]
            cited = supporting or list(facts)
            if not grounded or contained(answer, [f"{fact.title} {fact.text}" for fact in cited]):
                return dspy.Prediction(answer=answer, supporting=[fact.id for fact in supporting], replaced=None, ungrounded=False)
            holding = [fact for fact in facts if contained(answer, [f"{fact.title} {fact.text}"])]
            if grounded_in == "evidence" and holding:
                return dspy.Prediction(answer=answer, supporting=[fact.id for fact in holding], replaced=None, ungrounded=False)
        span = supported_span(question, cited, answer)
        return dspy.Prediction(answer=span or answer, supporting=[fact.id for fact in supporting], replaced=answer if span else None,
                               ungrounded=span is None)


class AnswerGenerator(dspy.Module):
    """Step 11: the question and the evidence chain -> the final short answer.

    With `choose`, an answer to a question that names its options ("..., Jaws or Duel?") that is
    none of them (the director found on the way, "No" to "Is A or B further west?") is asked for
    once more as a choice between the options (`ChooseAnswer`); a reply that is no option either,
    or does not parse, leaves the first answer. The options come from the question by rule
    (`question_options`), so no other question pays for the check.
    """

    def __init__(self):
        super().__init__()
        self.generate = _predictor(GenerateAnswer, GENERATE_DEMOS)
        self.choose = _predictor(ChooseAnswer, CHOOSE_DEMOS)

    def forward(self, question: str, evidence: Sequence[str], choose: bool = False) -> dspy.Prediction:
        answer = _short(self.generate(question=question, evidence=list(evidence)).answer)
        if not answer:
            raise MalformedOutput(f"no final answer to {question!r}")
        options = question_options(question) if choose else []
        if not options or names_an_option(answer, options):
            return dspy.Prediction(answer=answer, replaced=None)
        try:
            chosen = _short(self.choose(question=question, options=options, evidence=list(evidence)).answer)
        except (AdapterParseError, ValueError):
            chosen = ""
        if names_an_option(chosen, options):
            return dspy.Prediction(answer=chosen, replaced=answer)
        return dspy.Prediction(answer=answer, replaced=None)
