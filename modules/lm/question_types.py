"""Question types by rule, and what a rule does for each type in place of an LM step:

- `question_type`: comparison, equality, choice or other, from the question's words;
- `comparison_plan`: a comparison's sub-questions (step 4 without the decomposer);
- `rule_answer`: a comparison's answer from the chain's hop answers (step 11 without the reader);
- `last_hop_answer`: a chain whose last hop already answers what the question asks;
- `chain_problems`: a decomposition whose steps do not chain (for asking again).

"Which film came out first, Girl From Hong Kong or Forces Occultes?" with hops answering 1961
and 1943, or "Are the directors of C-Man and Greencastle from the same country?" with hops
answering "Canadian" and "Egypt", needs two values and a comparison a rule does exactly and a
1.5B reader often gets wrong. The rule decides only when every value it needs parses; otherwise
it says why and the LM reader answers. "When did the mother of the director of Jaws die?" asks
for a date that its last hop ("When did Leah Adler die?") has already found in its facts; the
reader, given the whole chain, can only lose it. No LM here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from modules.lm.checks import (
    DATE,
    MONTHS,
    NUMBER,
    content_words,
    lower_words,
    question_options,
)
from modules.lm.countries import countries_named
from modules.lm.references import references

QUESTION_TYPES = ("comparison", "equality", "choice", "other")

# The words that say which value wins, looked up in the question without its options (a film
# called "Before Sunrise" says nothing about the order).
_EARLIER = frozenset("first earlier earliest older oldest before sooner".split())
_LATER = frozenset("later latest last younger youngest after recently recent newer newest".split())
_MORE = frozenset("longer longest more most larger largest bigger biggest higher highest taller tallest greater".split())
_FEWER = frozenset("shorter shortest fewer less least smaller smallest lower lowest".split())
_AGES = frozenset("older oldest younger youngest".split())  # with ages instead of dates, older wins by the larger number
_LIFESPAN = re.compile(r"\blived? (?:longer|the longest)\b", re.IGNORECASE)
_SAME_COUNTRY = re.compile(r"\bsame (?:country|countries|nationality|nationalities|citizenship)\b"
                           r"|\bshare the same nationality\b", re.IGNORECASE)
_SAME = re.compile(r"\b(?:same|both)\b", re.IGNORECASE)
_YES_NO = re.compile(r"\s*(?:is|are|was|were|do|does|did|has|have|had|can|could|will|would)\b", re.IGNORECASE)  # a yes/no question
_BORN = re.compile(r"\b(?:born|birth)\b", re.IGNORECASE)
_DIED = re.compile(r"\b(?:die|died|death|dead)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Comparison:
    """What a comparison question asks, read from its words: name the option whose value is the
    least or, with `most`, the greatest (`kind="order"`), the values being dates, numbers or the
    years lived (`measure`); or say whether the things compared are from the same country
    (`kind="same"`). With `ages`, ages (numbers) stand in for birth dates when the hops answered
    those, and order the other way round ("older": the earlier birth date, the greater age).
    `event` ("born", "died") is what the dates must be of: only hops that ask for it count
    ("When did #1 direct their film?" answers no "born first")."""

    kind: str
    options: tuple[str, ...] = ()
    most: bool = False
    measure: str = "date"
    ages: bool = False
    event: str | None = None


@dataclass(frozen=True)
class Decision:
    """The rule's answer with the values it compared (`how`), or None and why it cannot decide."""

    answer: str | None
    how: str


def _without_options(question: str, options) -> str:
    """The question with its options cut out: their words say nothing about what is compared."""
    for option in options:
        question = question.replace(option, " ")
    return question


def comparison_of(question: str) -> Comparison | None:
    """The comparison a question asks for, when a rule can decide it; else None. A same-country
    question asks yes or no ("Are A and B from the same country?"; not "Who shares the same
    nationality as A?")."""
    if _SAME_COUNTRY.search(question):
        return Comparison("same") if _YES_NO.match(question) else None
    options = tuple(question_options(question, whole_names=True))
    if len(options) != 2:
        return None
    rest = _without_options(question, options)
    words = lower_words(rest)
    if _LIFESPAN.search(question):
        return Comparison("order", options, most=True, measure="lifespan")
    later, earlier = words & _LATER, words & _EARLIER
    if later or earlier:
        if later and earlier:
            return None
        event = "died" if _DIED.search(rest) else "born" if _BORN.search(rest) or (later | earlier) & _AGES else None
        return Comparison("order", options, most=bool(later), ages=bool((later | earlier) & _AGES), event=event)
    more, fewer = words & _MORE, words & _FEWER
    if more or fewer:
        return None if more and fewer else Comparison("order", options, most=bool(more), measure="number")
    return None


def question_type(question: str) -> str:
    """One of QUESTION_TYPES, by rule: "equality" (same country, both ...), "comparison" (an order
    between the options it names), "choice" (options, no order), else "other"."""
    if _YES_NO.match(question) and (_SAME_COUNTRY.search(question) or _SAME.search(question) and not question_options(question)):
        return "equality"
    comparison = comparison_of(question)
    if comparison is not None:
        return "comparison"
    return "choice" if question_options(question) else "other"


# --- the sub-questions of a comparison, by rule ----------------------------------------------------
_ROLE = re.compile(r"\b(director|composer|producer|screenwriter|writer|author|creator|founder|performer|lyricist)s?\b", re.IGNORECASE)
_WHEN = [  # what a comparison orders by, as the question words it -> the sub-questions about one thing
    (_LIFESPAN, ("When was {} born?", "When did {} die?")),
    (re.compile(r"\b(?:die|died|death)\b", re.IGNORECASE), ("When did {} die?",)),
    (re.compile(r"\b(?:born|older|younger|oldest|youngest)\b", re.IGNORECASE), ("When was {} born?",)),
    (re.compile(r"\bc(?:a|o)me out\b", re.IGNORECASE), ("When did {} come out?",)),
]
_WHEN_VERB = re.compile(r"\b(released|published|premiered|aired|established|founded|formed|opened|started|created|launched|built)\b",
                        re.IGNORECASE)
_COUNTRY_OF = [  # how a same-country question asks -> the sub-question about one thing
    (re.compile(r"\b(?:nationality|citizenship)\b", re.IGNORECASE), "What is the nationality of {}?"),
    (re.compile(r"\blocated\b", re.IGNORECASE), "Which country is {} located in?"),
]
_OPENING = re.compile(r"^\s*(?i:are|were|is|was|do|does|did|have|has)\b(?:[\s,:]+(?:[a-z][\w-]*))*[\s,:]+")
_ROLE_OF = re.compile(rf"^(?:the\s+)?{_ROLE.pattern}\s+of\s+(?:the\s+)?(?:(?:film|movie|song|album|book|play|series)\s+)?", re.IGNORECASE)
_SAME_AS = re.compile(r"^\s*(?i:does|do|did|is|was|has)\s+(?P<first>.+?)\s+(?:have|has|had|share|hold)\s+the\s+same\s+\w+\s+as\s+(?P<second>.+?)\s*\?*\s*$")
_NAME_JOINERS = frozenset("of de del la le du des da di von van der y the in on for".split())


def _leading_name(text: str) -> str:
    """The name a text starts with: words that start with a capital, a digit, a bracket or a quote,
    lower-case joiners ("of", "de") and commas between them; "" when it starts otherwise."""
    words, taken, pending = text.split(" "), [], []
    for word in words:
        if not word:
            break
        if word[0].isupper() or word[0].isdigit() or word[0] in "(\"'“&":
            taken += pending + [word]
            pending = []
        elif word in _NAME_JOINERS and taken:
            pending.append(word)
        else:
            break
    return " ".join(taken).rstrip(",")


def _thing(text: str) -> str:
    return _ROLE_OF.sub("", text.strip(" ,"))


def compared_things(question: str) -> tuple[str, str] | None:
    """The two things a same-country question names ("Are Wiqu (Lima) and Qillqa (Melgar) both
    located in the same country?" -> "Wiqu (Lima)", "Qillqa (Melgar)"; "Does A have the same
    nationality as B?"): the names on either side of its one lower-case "and" after the opening
    words (each without a leading "director of film"), or of "the same ... as"; None when the
    question has neither shape."""
    same_as = _SAME_AS.match(question)
    if same_as:
        first, second = _thing(same_as.group("first")), _thing(same_as.group("second"))
    else:
        opening = _OPENING.match(question)
        rest = question[opening.end():] if opening else ""
        if rest.count(" and ") != 1:
            return None
        first, second = (_thing(side) for side in rest.split(" and "))
        second = _leading_name(second)
    if not first or not second or _leading_name(first) != first:
        return None
    return first, second


def comparison_plan(question: str) -> list[str] | None:
    """The sub-questions a comparison needs, by rule, for the question shapes a rule reads
    without doubt: per compared thing (through its director, composer, ... when the question
    compares those) the date it is ordered by, or its country; "#k" for the bridge, as the
    decomposer writes it. None for any other question: the LM decomposes it."""
    comparison = comparison_of(question)
    if comparison is None:
        return None
    things = compared_things(question) if comparison.kind == "same" else comparison.options
    if not things:
        return None
    asked = _without_options(question, things)  # "Love & Death In Saigon" asks for no death date
    if comparison.kind == "same":
        asks = next((template for pattern, template in _COUNTRY_OF if pattern.search(asked)), "Which country is {} from?")
        templates = (asks,)
    else:
        templates = next((asks for pattern, asks in _WHEN if pattern.search(asked)), None)
        verb = _WHEN_VERB.search(asked)
        if templates is None and verb and comparison.measure == "date":
            templates = ("When was {} " + verb.group(1).lower() + "?",)
        if templates is None or comparison.measure == "number":
            return None
    role = _ROLE.search(asked)
    if role is None:
        return [template.format(thing) for thing in things for template in templates]
    bridges = [f"Who is the {role.group(1).lower()} of {thing}?" for thing in things]
    return bridges + [template.format(f"#{k}") for k in range(1, len(things) + 1) for template in templates]


# --- values ---------------------------------------------------------------------------------------
_MONTH_NUMBER = {name.lower(): n for n, name in enumerate(MONTHS.split("|"), start=1)}


def date_value(text: str) -> tuple[int, int | None, int | None] | None:
    """(year, month, day) of the one date a text holds ("29 February 1944", "January 3, 1960",
    "January 1963", "1952"); None when it holds none with a year, or two different ones."""
    found = set()
    for match in DATE.finditer(text):
        span = match.group()
        year = re.search(r"\d{3,4}$", span.rstrip(","))
        if not year:
            continue  # "May 3": no year
        month = re.search(MONTHS, span)
        day = re.search(r"(?<!\d)\d{1,2}(?!\d)", span[: year.start()])
        found.add((int(year.group()), _MONTH_NUMBER[month.group().lower()] if month else None,
                   int(day.group()) if day and month else None))
    return found.pop() if len(found) == 1 else None


def number_value(text: str) -> float | None:
    """The one number a text holds outside dates that name a month ("104 minutes", "12,000");
    None when it holds none or several ("54 in 1990")."""
    without_dates = DATE.sub(lambda m: " " if re.search(MONTHS, m.group()) else m.group(), text)
    found = {float(m.group().replace(",", "")) for m in NUMBER.finditer(without_dates)}
    return found.pop() if len(found) == 1 else None


def _order(a: tuple, b: tuple) -> int | None:
    """-1, 0 or 1 as date `a` is before, the same as, or after `b`; None when the parts both know
    are equal and one of them does not know the next ("1952" against "March 1952")."""
    for x, y in zip(a, b):
        if x is None or y is None:
            return None
        if x != y:
            return -1 if x < y else 1
    return 0


def _days(date: tuple) -> int | None:
    year, month, day = date
    return None if month is None or day is None else year * 372 + month * 31 + day


def _years_lived(born: tuple, died: tuple) -> float | None:
    """Years between two dates, to the day when both are full; by the year otherwise (None then,
    as the difference is not exact)."""
    start, end = _days(born), _days(died)
    return (end - start) / 372 if start is not None and end is not None else None


# --- reading the chain ------------------------------------------------------------------------------
def _answer_words(hop: dict) -> set[str]:
    words = content_words(hop["answer"])
    return set() if words <= {"yes", "no"} else words


def leaves(chain: list[dict]) -> list[tuple[dict, set[str]]]:
    """The hops whose answers no later hop uses, each with the words of its own and its
    ancestors' sub-questions and queries. A hop uses an earlier one by "#k" or by naming its
    answer in its query (a decomposition that wrote the bridge out)."""
    parents: list[set[int]] = []
    for j, hop in enumerate(chain):
        used = {k - 1 for k in references(hop["sub_question"]) if 1 <= k <= j}
        query = content_words(hop["query"])
        used |= {i for i in range(j) if _answer_words(chain[i]) and _answer_words(chain[i]) <= query}
        parents.append(used)
    used_by_later = set().union(*parents) if parents else set()

    def ancestry(j: int, seen: set[int]) -> set[str]:
        seen.add(j)
        words = content_words(f"{chain[j]['sub_question']} {chain[j]['query']}")
        for i in parents[j] - seen:
            words |= ancestry(i, seen)
        return words

    return [(hop, ancestry(j, set())) for j, hop in enumerate(chain) if j not in used_by_later]


def _option_words(option: str) -> set[str]:
    return content_words(re.sub(r"\([^()]*\)", " ", option)) or content_words(option)


def values_by_option(options: tuple[str, ...], chain: list[dict]) -> dict[str, list[dict]]:
    """The leaf hops that belong to each option: those whose sub-questions (with their
    ancestors') hold all the option's words, the option with the most words when several do."""
    belong: dict[str, list[dict]] = {option: [] for option in options}
    for hop, words in leaves(chain):
        matched = [option for option in options if _option_words(option) <= words]
        best = max((len(_option_words(o)) for o in matched), default=0)
        matched = [option for option in matched if len(_option_words(option)) == best]
        if len(matched) == 1:
            belong[matched[0]].append(hop)
    return belong


def decide(comparison: Comparison, chain: list[dict]) -> Decision:
    """The answer of a comparison from the chain's hop answers, or why the rule cannot tell."""
    if comparison.kind == "same":
        return _same_country(chain)
    belong = values_by_option(comparison.options, chain)
    missing = [option for option, hops in belong.items() if not hops]
    if missing:
        return Decision(None, f"no hop answers for {missing[0]!r}")
    most = comparison.most
    if comparison.measure == "lifespan":
        values = {option: _lifespan(option, hops) for option, hops in belong.items()}
    else:
        values = {option: _one_value(_asking(hops, comparison.event), comparison.measure, option, comparison.event)
                  for option, hops in belong.items()}
        if comparison.ages and any(isinstance(v, str) for v in values.values()):
            ages = {option: _one_value(hops, "number") for option, hops in belong.items()}
            if not any(isinstance(v, str) for v in ages.values()):
                values, most = ages, not most
    problem = next((value for value in values.values() if isinstance(value, str)), None)
    if problem:
        return Decision(None, problem)
    (a, value_a), (b, value_b) = values.items()
    order = _order(value_a, value_b) if isinstance(value_a, tuple) else (value_a > value_b) - (value_a < value_b)
    if not order:
        return Decision(None, f"{a!r} ({_shown(value_a)}) and {b!r} ({_shown(value_b)}) cannot be told apart")
    winner = a if (order < 0) != most else b
    return Decision(winner, f"{a} ({_shown(value_a)}) {'<' if order < 0 else '>'} {b} ({_shown(value_b)}), "
                            f"{'the greater' if most else 'the lesser'} wins")


def _asking(hops: list[dict], event: str | None) -> list[dict]:
    """The hops whose query asks for the event's date (all of them without an event)."""
    asks = {"born": _BORN, "died": _DIED}.get(event)
    return [hop for hop in hops if asks is None or asks.search(hop["query"])]


def _one_value(hops: list[dict], measure: str, option: str = "", event: str | None = None):
    """The one date or number the hops answer, or why there is none."""
    if not hops:
        return f"no hop asks when {option!r} {'was born' if event == 'born' else 'died'}"
    parse = date_value if measure == "date" else number_value
    found = {parse(hop["answer"]) for hop in hops} - {None}
    if len(found) != 1:
        answers = ", ".join(repr(hop["answer"]) for hop in hops)
        return f"{'no' if not found else 'more than one'} {measure} in {answers}"
    return found.pop()


def _lifespan(option: str, hops: list[dict]):
    born = [hop for hop in hops if _BORN.search(hop["query"])]
    died = [hop for hop in hops if _DIED.search(hop["query"])]
    if not born or not died:
        return f"no {'birth' if not born else 'death'} date asked for {option!r}"
    start, end = _one_value(born, "date"), _one_value(died, "date")
    for value in (start, end):
        if isinstance(value, str):
            return value
    years = _years_lived(start, end)
    return f"the years {option!r} lived are not exact to the day" if years is None else years


def _shown(value) -> str:
    if isinstance(value, tuple):
        return "-".join(str(part) for part in value if part is not None)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _same_country(chain: list[dict]) -> Decision:
    found = [(hop["answer"], countries_named(hop["answer"])) for hop, _ in leaves(chain)]
    if len(found) != 2:
        return Decision(None, f"the chain ends in {len(found)} answers, not the 2 compared")
    unknown = [answer for answer, countries in found if not countries]
    if unknown:
        return Decision(None, f"no country in {unknown[0]!r}")
    (a, first), (b, second) = found
    shared = first & second
    return Decision("yes" if shared else "no", f"{a!r} -> {', '.join(sorted(first))}; {b!r} -> {', '.join(sorted(second))}")


def rule_answer(question: str, chain: list[dict], both: bool = False) -> Decision | None:
    """The rule's decision for a comparison question, and with `both` for a yes/no question
    about two things at once (`both_answer`); None for any other question."""
    comparison = comparison_of(question)
    if comparison is not None:
        return decide(comparison, chain)
    return both_answer(question, chain) if both else None


_BOTH = re.compile(r"\bboth\b", re.IGNORECASE)


def both_answer(question: str, chain: list[dict]) -> Decision | None:
    """"Are both A and B ice plants?" (and "Are A and B both ...?"): "no" when a hop answered no,
    "yes" when at least two hops answered yes or no and all said yes. A small final reader
    answers such questions "yes" whatever the hops found (12 of 13 wrong ones on HotpotQA train).
    None for other questions (the same-country ones have their own rule) and for chains with
    fewer than two yes/no hop answers."""
    if not _YES_NO.match(question) or not _BOTH.search(question) or _SAME_COUNTRY.search(question):
        return None
    said = [hop["answer"] for hop in chain if lower_words(hop["answer"]) in ({"yes"}, {"no"})]
    if len(said) < 2:
        return None
    answer = "no" if any(lower_words(a) == {"no"} for a in said) else "yes"
    return Decision(answer, f"both: the hops answered {', '.join(a.lower() for a in said)}")
