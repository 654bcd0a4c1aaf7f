"""Where a wrong answer went wrong: the first failing stage of each question, and a summary per system.

Why: a researcher's first question about a wrong multi-hop answer is which hop failed, and why.
Each wrongly answered question (EM 0) is put at the first of these stages that fails, walking the
gold steps in order, so a lost bridge is not also counted as the lost passages after it:

- decomposition: a gold step that names its entity (no "#k") names a word of the question that no
  sub-question of the program has;
- retrieval: the passage a gold step is answered from (every gold passage, where the dataset has
  no steps) is never reached: in no hop's facts and not among the top 5 passages;
- bridge: a gold step before the last has an answer that no hop answer matches (token F1 >= 0.5);
- final reader: everything above held, and the final answer is still wrong.

Question-only systems have no sub-questions and no hop answers: only retrieval and the final
reader apply to them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from experiments.data import Question
from experiments.metrics import f1_score
from modules.lm.checks import lower_words, named_words
from modules.lm.references import references
from pipeline.serve.pages import chain_page, index_page, page_name, reached_passages

STAGES = ("decomposition", "retrieval", "bridge", "final reader")
BRIDGE_F1 = 0.5  # a hop answer this close to a gold intermediate answer carries the bridge
EXAMPLES = 2  # questions shown per stage


def step_subject(step: str) -> set[str]:
    """The named words of the entity a gold step asks about: before ">>" in a relation step
    ("Sudden Fear >> publication date"), else the step's own names ("Who directed Jaws?")."""
    if ">>" in step:
        return named_words(step.split(">>")[0])
    return named_words(step, skip_first=True)


def failure_stage(row: dict, question: Question) -> str | None:
    """The first stage that failed for a wrongly answered question (None when the answer is right)."""
    if row.get("em", 0.0) >= 1.0:
        return None
    hops = [hop for hop in row.get("chain") or [] if "answer" in hop]  # the program's answered hops
    if hops:
        asked = set().union(*(lower_words(f"{hop.get('sub_question', '')} {hop['query']}") for hop in hops))
        named = lower_words(question.question)  # a gold step's own spelling or additions ("... in NYC?") do not count
        if any(not references(step.question) and not (step_subject(step.question) & named) <= asked for step in question.decomposition):
            return "decomposition"
    seen = reached_passages(row)
    if not question.decomposition:
        return "retrieval" if not set(question.gold_passages) <= seen else "final reader"
    answers = [hop["answer"] for hop in hops]
    last = len(question.decomposition) - 1
    for position, step in enumerate(question.decomposition):
        if step.passage is not None and step.passage not in seen:
            return "retrieval"
        if hops and position < last and not any(f1_score(answer, [step.answer]) >= BRIDGE_F1 for answer in answers):
            return "bridge"
    if not set(question.gold_passages) <= seen:
        return "retrieval"
    return "final reader"


def failure_summary(rows: Sequence[dict], questions: Sequence[Question]) -> dict:
    """Per stage, how many questions failed there and the first `EXAMPLES` of them (ids), plus the
    number answered right; {} for rows without answers (a retrieval-only run)."""
    if not rows or "em" not in rows[0]:
        return {}
    by_id = {question.id: question for question in questions}
    summary = {"right": 0, **{stage: {"n": 0, "examples": []} for stage in STAGES}}
    for row in rows:
        stage = failure_stage(row, by_id[row["id"]])
        if stage is None:
            summary["right"] += 1
            continue
        summary[stage]["n"] += 1
        if len(summary[stage]["examples"]) < EXAMPLES:
            summary[stage]["examples"].append(row["id"])
    return summary


def page_link(folder: str = "pages") -> Callable[[str, str], str | None]:
    """Where a question's page of a system lies, relative to the file that links to it."""

    return lambda system, question_id: f"{folder}/{system}/{page_name(question_id)}"


def failure_table(summaries: Sequence[dict], link: Callable[[str, str], str | None] | None = None) -> str:
    """Markdown: per system, questions answered right and wrong ones by the stage that failed,
    each stage with its examples (linked to their evidence-chain pages where `link` gives one)."""
    failing = [s for s in summaries if s.get("failures")]
    if not failing:
        return ""
    lines = ["\n## Where the wrong answers failed\n", *failure_counts(failing), ""]
    for s in failing:
        shown = []
        for stage in STAGES:
            ids = s["failures"][stage]["examples"]
            targets = [link(s["system"], i) if link else None for i in ids]
            cited = [f"[{i}]({target})" if target else f"`{i}`" for i, target in zip(ids, targets)]
            if cited:
                shown.append(f"{stage}: {', '.join(cited)}")
        if shown:
            lines.append(f"- {s['system']}: " + "; ".join(shown))
    return "\n".join(lines) + "\n"


def failure_counts(failing: Sequence[dict]) -> list[str]:
    """Markdown lines: per system (summaries with `failures`), questions answered right and the
    wrong ones by the stage that failed first."""
    return ["| system | right | " + " | ".join(STAGES) + " |", "|---|---:|" + "---:|" * len(STAGES),
            *(f"| {s['system']} | {s['failures']['right']} | " + " | ".join(str(s["failures"][stage]["n"]) for stage in STAGES) + " |"
              for s in failing)]


def gold_of(question: Question) -> dict:
    """What a page marks as gold: the answer, the passages and the steps with their answers."""
    return {"answer": question.answer, "passages": list(question.gold_passages),
            "steps": [(step.question, step.answer) for step in question.decomposition]}


def write_pages(directory: Path, results: dict[str, list[dict]], questions: Sequence[Question], titles: Sequence[str]) -> int:
    """An evidence-chain page per question and system that answered (`directory/<system>/<id>.html`),
    an index per system (wrong answers first, by the stage that failed, then by F1) and one of the
    systems (`directory/index.html`). Returns the number of question pages."""

    by_id = {question.id: question for question in questions}
    systems, written = [], 0
    for system, rows in results.items():
        if not rows or "em" not in rows[0]:
            continue
        folder = directory / system
        folder.mkdir(parents=True, exist_ok=True)
        listed = []
        for row in rows:
            question = by_id[row["id"]]
            stage = failure_stage(row, question)
            (folder / page_name(row["id"])).write_text(chain_page(row, titles, gold_of(question), system, stage, "index.html"),
                                                       encoding="utf-8")
            listed.append((STAGES.index(stage) if stage else len(STAGES), row["f1"], row, stage))
            written += 1
        listed.sort(key=lambda item: item[:2])
        entries = [{"name": row["id"], "href": page_name(row["id"]),
                    "cells": [row["question"], row["answer"], by_id[row["id"]].answer, round(row["em"], 2), round(row["f1"], 2),
                              round(row["recall@5"], 2) if "recall@5" in row else "–", stage or "right"]} for _, _, row, stage in listed]
        (folder / "index.html").write_text(index_page(
            f"{system}: {len(rows)} questions", ["question id", "question", "answer", "gold answer", "EM", "F1", "Recall@5", "failed at"],
            entries, note="Wrong answers first, by the stage that failed, then by F1; click a column head to sort by it.",
            up="../index.html"), encoding="utf-8")
        right = sum(row["em"] >= 1 for row in rows)
        systems.append({"name": system, "href": f"{system}/index.html",
                        "cells": [len(rows), right, len(rows) - right, round(100 * sum(r["f1"] for r in rows) / len(rows), 2)]})
    if systems:
        (directory / "index.html").write_text(index_page("Evidence chains by system", ["system", "questions", "right", "wrong", "F1"], systems),
                                              encoding="utf-8")
    return written
