"""English text rules, in one place: what the LM modules check their output with (content and
named words, dates and numbers, the kind of answer a question asks for, spans of facts,
identity questions, the options a question names) and the `sentences` extractor's rules
(sentences, pronouns, entity spans; METHOD.md step 1). No LM here: each rule is a few lines a
test works out by hand.
"""

from __future__ import annotations

import bisect
import re
from typing import Iterator, Sequence

from modules.facts import ScoredFact
from modules.lm.countries import countries_named
from modules.lm.references import REFERENCE

MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"


def single_spaced(text: object) -> str:
    """The text on one line, whitespace runs as single spaces (None as "")."""
    return " ".join(str(text or "").split()).strip()


# --- checks on what the LM wrote -----------------------------------------------------------------
_STOPWORDS = frozenset(
    "the a an and or of in on at to for by with from as is was were are be been has had have it its his her "
    "their he she they this that which who whom also not but into after before during".split()
)
GROUNDED_SHARE = 0.6  # of a fact's content words that must occur in its passage


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if w not in _STOPWORDS}


def _supported(entity: str, source: set[str]) -> bool:
    words = content_words(entity)
    return bool(words) and words <= source


def supported_entities(listed, source: set[str]) -> list[str]:
    """The listed entities whose words the source has, each once, whitespace normalised."""
    return list(dict.fromkeys(e for e in (single_spaced(e) for e in listed or []) if _supported(e, source)))


def fact_grounded(fact: str, source: set[str]) -> bool:
    words = content_words(fact)
    return bool(words) and len(words & source) >= GROUNDED_SHARE * len(words)


def entity_budget(title: str, passage: str) -> int:
    """Output tokens for one passage's entities: about a third of the passage, as a list of names
    is much shorter than the facts (`extraction_budget`)."""
    return min(384, 48 + len(title + passage) // 12)


def extraction_budget(title: str, passage: str) -> int:
    """Output tokens for one passage's facts and entities: about twice the passage (a token is
    about 4 characters), so a small model that starts repeating itself stops early instead of
    filling 1,024 tokens (minutes on a CPU) before the retry."""
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


def contained(answer: str, texts: Sequence[str], countries: bool = False) -> bool:
    """Whether the texts contain the answer: all its content words (yes/no always counts); with
    `countries`, also an answer whose countries the texts name by other words ("Austria" in "an
    Austrian composer", "United States" in "an American film")."""
    words = content_words(answer)
    if not words or words <= {"yes", "no"}:
        return True
    joined = " ".join(texts)
    if words <= content_words(joined):
        return True
    named = countries_named(answer) if countries else frozenset()
    return bool(named) and named <= countries_named(joined)


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
_MONTH = rf"(?:{MONTHS})"
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
    back, and a "Who ...?" never a year ("Marie Méliès 8 December 1861" -> "Marie Méliès"). None
    when the facts hold no span of that kind."""
    asked = lower_words(query)
    kind = answer_kind(query, answer)
    for fact in facts:
        for span in _spans(fact.text, kind):
            if named_words(span) - asked:
                return span
    return None


# Words that make "A or B" a choice between two names rather than part of a title ("Dead or Alive").
_COMPARING = frozenset(
    "first last earlier earliest later latest older oldest younger youngest longer longest shorter shortest taller "
    "tallest higher highest lower lowest bigger biggest larger largest smaller smallest further farther closer nearer "
    "more most less least fewer greater before after".split()
)
_CHOOSING = frozenset("which who whose is are was were do does did has have had".split())  # openings of a choice question
_ASKING_AFTER = frozenset("for in on of to at by from with under".split())  # "For which ...", "In which ...": a choice question too
_MOST_OPTION_WORDS = 16  # 2Wiki has film titles of 14 words


def question_options(question: str, whole_names: bool = False) -> list[str]:
    """The answers a question names as its options, else []: "Which film came out first, Jaws or
    Duel?" and "Who played in Soulfly, Max Cavalera or Billy Idol?" (after the last comma or colon,
    or with `whole_names` the first, so that "Love, Honor And Oh-Baby!" stays one name; in a
    question opening with which/who/is/... or comparing); in a comparing question also "Is
    Muskegon County Airport or John Wayne Airport further west?" (two named spans around "or") and
    "Who was born first out of A and B?".
    A title with "or" in it ("Who directed Dead or Alive?") is no choice."""
    text = question.strip().rstrip("?").strip()
    comparing = bool(lower_words(text) & _COMPARING)
    between = re.search(r"\b(?:out of|between) (.+) and (.+)$", text)
    head, joined, right = text.rpartition(" or ")
    head = head.rstrip(" ,")  # "A, or B"
    clause = re.split(r"[,:;]", head, maxsplit=1 if whole_names else 0)[-1]
    opening = text.lower().split()[:2] or [""]
    choosing = opening[0] in _CHOOSING or (opening[0] in _ASKING_AFTER and opening[1:] in (["which"], ["whose"]))
    if comparing and between and not joined:  # "Who was born first out of A and B?"
        options = list(between.groups())
    elif not joined:
        return []
    elif clause != head and (comparing or choosing):
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
    if any(not content_words(o) or len(o.split()) > _MOST_OPTION_WORDS for o in options) or content_words(options[0]) == content_words(options[1]):
        return []
    return options


def names_an_option(answer: str, options: Sequence[str]) -> bool:
    """Whether the answer is one of the options: its content words within an option's, or an
    option's within its own ("Tea Moderna (magazine)")."""
    words = content_words(answer)
    return bool(words) and any(words <= content_words(o) or content_words(o) <= words for o in options)


def mentioned(entities: Sequence[str], text: str) -> list[str]:
    """The entities whose name occurs in the text (case-insensitive, on word boundaries)."""
    lowered = text.lower()
    return [e for e in entities if re.search(rf"(?<!\w){re.escape(e.lower())}(?!\w)", lowered)]


# --- the `sentences` extractor's rules (METHOD.md step 1) ------------------------------------------
# Its own patterns where they differ from the answer checks above on purpose: NAMED_DATE takes
# only dates that name a month (a bare year is a number entity, so "1929" joins every fact of
# that year once, not twice), and a capitalised run drops a wider set of leading function words
# (_LEADING_WORDS) than the named-word check skips. Changing either changes the index.
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "gen", "col", "lt", "sgt", "capt", "gov",
    "sen", "rep", "rev", "mt", "ft", "no", "vol", "vs", "etc", "inc", "ltd", "co", "corp", "jan",
    "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.k",
    "e.g", "i.e", "approx", "est", "ca", "c",
}
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”)]?\s+(?=[A-Z0-9\"“'(])")
_SUBJECT_PRONOUN = re.compile(r"^(He|She|It|They)\b")
_CONTRACTED = re.compile(r"^(?:He|She|It|They)['’]")
_POSSESSIVE_PRONOUN = re.compile(r"^(His|Her|Its|Their)\b")
_PARENTHETICAL = re.compile(r"\s*\([^)]*\)\s*$")
NAMED_DATE = re.compile(
    rf"\b(?:\d{{1,2}} (?:{MONTHS})(?:,? \d{{3,4}})?|(?:{MONTHS}) \d{{1,2}}, \d{{3,4}}|(?:{MONTHS}) \d{{3,4}})\b"
)
_ENTITY_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?: (?:BC|BCE|AD|CE)\b)?(?![\w])")
_CONNECTORS = r"(?:of|the|de|del|della|da|di|du|la|le|von|van|der|den|for|al|bin|ibn)"
_CAPITALISED = re.compile(
    rf"\b[A-Z][\w'’&.-]*(?:\s+(?:{_CONNECTORS}\s+)*[A-Z][\w'’&.-]*)*"
)
_LEADING_WORDS = {
    "a", "an", "the", "in", "on", "at", "of", "for", "to", "by", "with", "from", "after", "before",
    "during", "since", "as", "he", "she", "it", "they", "his", "her", "its", "their", "this", "that",
    "these", "those", "there", "here", "when", "where", "while", "although", "however", "but", "and",
    "or", "if", "some", "many", "most", "other", "both", "each", "one", "we", "i", "you", "what",
    "who", "which", "following", "today", "also", "between", "under", "over", "despite", "bc", "bce",
    "ad", "ce",
}


_LAST_WORD = re.compile(r"(\S+)\s*$")
_WORD_WINDOW = 64  # characters looked at before a boundary: longer than any abbreviation


def split_sentences(text: str) -> list[str]:
    """Rule 1: sentence boundaries that are not abbreviations or initials.

    Only the last word before a boundary is examined, within a short window, so the cost is
    linear in the text even when many abbreviations in a row keep a sentence open ("Dr. " x 20,000).
    """
    sentences: list[str] = []
    start = 0
    for boundary in _SENTENCE_END.finditer(text):
        last = _LAST_WORD.search(text, max(start, boundary.start() - _WORD_WINDOW), boundary.start())
        last_word = last.group(1) if last else ""
        stem = last_word.rstrip(".!?\"'”)").lower()
        if last_word.endswith(".") and (stem in _ABBREVIATIONS or re.fullmatch(r"[a-z]", stem)):
            continue
        sentences.append(text[start : boundary.end()].strip())
        start = boundary.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]


FENCE = "```"  # a code block in a passage's text (pipeline.index.documents writes them so)
MIN_FACT_WORDS = 3  # a sentence shorter than this ("Congrats!", "1") is no fact alone: it joins a neighbour


def text_blocks(text: str) -> Iterator[tuple[bool, list[str]]]:
    """A text's lines with each fenced code block as one item: (False, [line]) for a line outside a
    block, (True, the lines between its fences) for a block; one left open closes at the end. The
    one reading of fences that both splitting a page and extracting its facts use."""
    code: list[str] | None = None  # the lines of an open code block
    for line in text.split("\n"):
        if code is not None:
            if line.strip() == FENCE:
                yield True, code
                code = None
            else:
                code.append(line)
        elif line.strip().startswith(FENCE):
            code = []
        else:
            yield False, [line]
    if code is not None:
        yield True, code


def text_units(text: str) -> list[tuple[str, bool]]:
    """A passage's sentences line by line, never across a line, each fenced code block whole (its
    lines closed up); with each, whether it starts its line."""
    units: list[tuple[str, bool]] = []
    for code, lines in text_blocks(text):
        if code:
            if body := " ".join(" ".join(lines).split()):
                units.append((body, True))
        elif line := " ".join(lines[0].split()):
            units += [(sentence, n == 0) for n, sentence in enumerate(split_sentences(line))]
    return units


def document_sentences(text: str) -> list[str]:
    """Rule 1 for text kept in lines (`sentence_rules` 2): the sentences of each line (`text_units`);
    one that ends with ":" ("For example:") together with what it introduces, the next sentence,
    line or code block; one under MIN_FACT_WORDS words joined to the sentence before it on its
    line, or, first on its line (a term, a label) or introducing, to the one after it. So every fact is a
    whole statement, and all of the text is in some fact."""
    facts: list[str] = []
    waiting = ""  # a short sentence that starts its line, kept for the next
    for unit, first in text_units(text):
        unit = f"{waiting} {unit}" if waiting else unit
        waiting = ""
        short = len(unit.split()) < MIN_FACT_WORDS
        if facts and (facts[-1].endswith(":") or (short and not first and not unit.endswith(":"))):
            facts[-1] += " " + unit
        elif short:
            waiting = unit
        else:
            facts.append(unit)
    if waiting:
        facts = facts[:-1] + [f"{facts[-1]} {waiting}"] if facts else [waiting]
    return facts


def subject_name(title: str) -> str:
    """A title without its disambiguating parenthetical: "Jaws (film)" -> "Jaws"."""
    return _PARENTHETICAL.sub("", title).strip() or title.strip()


def resolve_pronoun(sentence: str, subject: str, contractions: bool = True) -> tuple[str, bool]:
    """Rule 2: replace a sentence-initial pronoun with the subject; says whether it did. Without
    `contractions` a contracted pronoun ("It’s identical") is left alone: read as a possessive it
    became "<title>’s identical"."""
    if _POSSESSIVE_PRONOUN.match(sentence):
        return _POSSESSIVE_PRONOUN.sub(f"{subject}'s", sentence, count=1), True
    if _SUBJECT_PRONOUN.match(sentence) and (contractions or not _CONTRACTED.match(sentence)):
        return _SUBJECT_PRONOUN.sub(subject, sentence, count=1), True
    return sentence, False


class Spans:
    """Character spans taken by dates and the subject: whether a match overlaps one, or starts
    inside one, by binary search over the merged spans (linear in the sentence, not in the
    product of its names and dates)."""

    def __init__(self, spans: list[tuple[int, int]]):
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [start for start, _ in merged]
        self.ends = [end for _, end in merged]

    def _last_starting_before(self, position: int) -> int:
        return bisect.bisect_left(self.starts, position) - 1

    def overlaps(self, start: int, end: int) -> bool:
        k = self._last_starting_before(end)
        return k >= 0 and self.ends[k] > start

    def holds(self, position: int) -> bool:
        k = bisect.bisect_right(self.starts, position) - 1
        return k >= 0 and position < self.ends[k]


def find_entities(sentence: str, subject: str) -> list[str]:
    """Rule 3: title, capitalised spans, dates and numbers, in order of first appearance."""
    found: list[tuple[int, str]] = []
    dates = list(NAMED_DATE.finditer(sentence))
    taken = [(m.start(), m.end()) for m in dates]
    at = sentence.lower().find(subject.lower()) if subject else -1
    if at >= 0:
        found.append((at, subject))
        taken.append((at, at + len(subject)))
    taken_spans = Spans(taken)
    found += [(m.start(), m.group()) for m in dates]
    for match in _CAPITALISED.finditer(sentence):
        span = match.group().rstrip(".'’-")
        words = span.split()
        while words and words[0].lower() in _LEADING_WORDS:
            words = words[1:]
        if not words or (len(words) == 1 and words[0].lower() in _LEADING_WORDS):
            continue
        if taken_spans.overlaps(match.start(), match.end()):
            continue
        found.append((match.start(), " ".join(words)))
    for match in _ENTITY_NUMBER.finditer(sentence):
        digits = re.sub(r"\D", "", match.group())
        if len(digits) >= 2 and not taken_spans.holds(match.start()):
            found.append((match.start(), match.group()))
    ordered = dict.fromkeys(name for _, name in sorted(found, key=lambda item: item[0]))
    return list(ordered)
