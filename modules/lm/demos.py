"""The built-in demonstrations of the LM steps, as data.

A 1.5B local model follows the signatures of `modules.lm.signatures` only with examples in front
of it, so every predictor ships one or two hand-written demonstrations (about one invented film,
not taken from any benchmark). An optimizer (`hyperprove compile`) replaces them.
"""

from __future__ import annotations

import dspy

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
# the facts a decomposer that reads them is shown with each decomposition demo (same order)
DECOMPOSE_FACTS = [
    ["(Jaws (film)) Jaws is a 1975 American thriller film directed by Steven Spielberg.",
     "(Leah Adler) Leah Adler was the mother of the film director Steven Spielberg."],
    ["(Spielberg Prize) The Spielberg Prize is an award named after the director Steven Spielberg.",
     "(Kate Capshaw) Kate Capshaw has been married to Steven Spielberg since 1991."],
    ["(Jaws (film)) Jaws is a 1975 American thriller film directed by Steven Spielberg.",
     "(Close Encounters of the Third Kind) Close Encounters of the Third Kind is a 1977 science fiction film."],
    ["(Duel (1971 film)) Duel is a 1971 thriller film directed by Steven Spielberg.",
     "(Jaws (film)) Jaws is a 1975 American thriller film directed by Steven Spielberg."],
]


def with_facts(demos: list[dspy.Example], facts: list[list[str]] = DECOMPOSE_FACTS) -> list[dspy.Example]:
    """The decomposition demos as a decomposer that reads facts sees them (`facts` in their order)."""
    return [dspy.Example(**demo.toDict(), facts=shown).with_inputs("question", "facts") for demo, shown in zip(demos, facts)]


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


# Questions about a software manual (settings, commands, flags, environment variables, versions)
# get these instead of the encyclopedia ones above, in the decomposer and the hop reader
# (`documentation_demos`; `modules.lm.pool.QuestionShape` decides which a question gets). They
# are about no real tool, so no evaluation folder's wording is in them. A documentation bridge
# names what it asks about by a description ("the setting that limits ..."), often in a sentence
# before the question; the first hop finds the thing described, the next asks about it.
DOC_DECOMPOSE_DEMOS = [
    dspy.Example(
        question="Which environment variable overrides the setting that limits how many jobs a build runs in parallel?",
        sub_questions=["Which setting limits how many jobs a build runs in parallel?", "Which environment variable overrides #1?"],
    ).with_inputs("question"),
    dspy.Example(
        question="Lock files keep builds repeatable, and the manual shows this with a command that ignores them. "
                 "Which option makes that command respect them?",
        sub_questions=["Which command ignores lock files?", "Which option makes #1 respect lock files?"],
    ).with_inputs("question"),
    dspy.Example(
        question="Which release shipped the configuration format in which every section needs a name?",
        sub_questions=["In which configuration format does every section need a name?", "Which release shipped #1?"],
    ).with_inputs("question"),
    dspy.Example(
        question="Which flag of the install command skips the lock file?",
        sub_questions=["Which flag of the install command skips the lock file?"],
    ).with_inputs("question"),
]
DOC_COMPARISON_DEMOS = [
    dspy.Example(
        question="Which option can delete files: --prune or --dry-run?",
        sub_questions=["Can --prune delete files?", "Can --dry-run delete files?"],
    ).with_inputs("question"),
]
DOC_DECOMPOSE_FACTS = [
    ["(Configuration › build.jobs) Sets the maximum number of jobs a build runs in parallel.",
     "(Environment variables) BUILD_JOBS overrides build.jobs."],
    ["(Commands › update) The update command ignores the lock file and resolves every dependency again.",
     "(Lock files) A lock file records the exact version of every dependency."],
    ["(Release notes › 3.0) Release 3.0 introduced the v2 configuration format.",
     "(Configuration › v2 format) In the v2 format every section needs a name."],
    ["(Commands › install) The --no-lock flag makes install skip the lock file.",
     "(Lock files) A lock file records the exact version of every dependency."],
    ["(Commands › clean) The --prune option deletes files that no target produces.",
     "(Commands › clean) The --dry-run option lists the files clean would delete, and deletes none."],
]
DOC_ANSWER_HOP_DEMOS = [
    dspy.Example(
        question="Which environment variable overrides build.jobs?",
        evidence=[
            "[1] (Configuration › build.jobs) Sets the maximum number of jobs a build runs in parallel.",
            "[2] (Configuration › build.jobs) It can be overridden with the BUILD_JOBS environment variable or the --jobs flag.",
            "[3] (Environment variables) Each of these variables overrides the setting it names.",
        ],
        answer="BUILD_JOBS",
        supporting=[2],
    ).with_inputs("question", "evidence"),
    dspy.Example(
        question="What does the --locked flag require of the lock file?",
        evidence=[
            "[1] (Commands › install) With --locked, the lock file must be up to date; install exits with an error instead of changing it.",
            "[2] (Lock files) A lock file records the exact version of every dependency.",
            "[3] (Commands › install) ```install --locked --jobs 4```",
        ],
        answer="that the lock file is up to date",
        supporting=[1],
    ).with_inputs("question", "evidence"),
]
