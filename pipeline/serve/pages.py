"""Evidence-chain pages: one answer as a self-contained HTML page, and index pages that list them.

Why: "which hop went wrong" should take one look, not a read of predictions.json. A page shows
the question, each hop (sub-question, rewritten query, the K facts with score, cos and struct and
their passage titles, the answer and the facts it cites), the frontier each hop starts from as
links to the hop that found those facts, the top passages, and, where the gold is known, the gold
passages (reached or not) and the gold steps. Rendered by Jinja2 templates (`templates/`,
autoescaped); no network fetch, and no JavaScript needed to read (an index only adds sorting).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Sequence

SCORES = (("em", "EM"), ("f1", "F1"), ("recall@2", "Recall@2"), ("recall@5", "Recall@5"))


@lru_cache(maxsize=1)
def _templates():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")), autoescape=True,
                              undefined=jinja2.StrictUndefined)


def page_name(question_id: str) -> str:
    """A file name for a question's page: its id with anything but word characters, '.' and '-' as '_'."""
    return re.sub(r"[^\w.-]", "_", question_id) + ".html"


def reached_passages(record: dict) -> set[int]:
    """The passages an answer had in front of it: its top 5, and every hop's facts'."""
    return set(record.get("passages", [])[:5]) | {fact["passage"] for hop in record.get("chain") or [] for fact in hop.get("facts", [])}


def chain_view(record: dict, titles: Sequence[str], gold: dict | None = None, sources: Sequence[str | None] | None = None) -> dict:
    """What a page shows of one answer (`record`: a prediction row, or what `ask` returns);
    `gold` ({"answer", "passages", "steps": [(question, answer), ...]}) adds the gold marks,
    `sources` (per passage, the file it came from) where each passage came from."""
    gold_passages = set(gold["passages"]) if gold else set()
    steps = gold["steps"] if gold else []
    first_seen: dict[int, int] = {}  # fact id -> the hop whose table shows it first (its anchor)
    hops = []
    chain = record.get("chain") or []
    for position, hop in enumerate(chain):
        number = hop.get("hop", position + 1)
        facts = []
        for fact in hop.get("facts", []):
            anchor = f"fact-{fact['id']}" if fact["id"] not in first_seen else f"hop-{number}-fact-{fact['id']}"
            first_seen.setdefault(fact["id"], number)
            facts.append({**fact, "anchor": anchor, "cited": fact["id"] in hop.get("supporting", []),
                          "gold": fact["passage"] in gold_passages})
        frontier = hop.get("frontier_in", [])
        following = chain[position + 1].get("frontier_in", []) if position + 1 < len(chain) else []
        hops.append({
            "number": number, "sub_question": hop.get("sub_question", hop["query"]), "query": hop["query"],
            "answer": hop.get("answer"), "cited": list(hop.get("supporting", [])), "facts": facts,
            "frontier_in": [{"id": i, "hop": first_seen.get(i)} for i in frontier],
            "carried": [i for i in following if i not in frontier], "carried_to": number + 1 if following else None,
            "gold_step": {"question": steps[position][0], "answer": steps[position][1]} if position < len(steps) else None,
        })
    reached = reached_passages(record)
    em = record.get("em")
    return {
        "question": record["question"], "id": record.get("id"), "answer": record.get("answer", ""),
        "gold_answer": gold["answer"] if gold else None,
        "verdict": None if em is None else "right" if em >= 1 else "wrong",
        "scores": [(label, f"{record[key]:.2f}") for key, label in SCORES if record.get(key) is not None],
        "hops": hops, "fallbacks": record.get("fallbacks", []), "system": None, "stage": None, "index": None,
        "passages": [{"id": p, "title": titles[p], "gold": p in gold_passages, "source": sources[p] if sources else None}
                     for p in record.get("passages", [])[:5]],
        "gold_passages": [{"id": p, "title": titles[p], "reached": p in reached} for p in sorted(gold_passages)],
    }


def chain_page(record: dict, titles: Sequence[str], gold: dict | None = None, system: str | None = None,
               stage: str | None = None, index: str | None = None, sources: Sequence[str | None] | None = None) -> str:
    """One answer's page; `stage` names where a wrong answer failed, `index` links back."""
    page = {**chain_view(record, titles, gold, sources), "system": system, "stage": stage, "index": index}
    return _templates().get_template("chain.html").render(page=page)


def chain_parts():
    """The macros of `templates/chain_parts.html` (summary, plan, hop_section, chain_body, ...),
    for a page built a piece at a time."""
    return _templates().get_template("chain_parts.html").module


def live_page(title: str, note: str) -> str:
    """The page of `hyperprove serve`: a question box; the plan, each hop and the final chain
    appear as the server streams them."""
    return _templates().get_template("serve.html").render(title=title, note=note)


def index_page(title: str, columns: Sequence[str], rows: Sequence[dict], note: str | None = None, up: str | None = None) -> str:
    """A table of links: each row {"name", "href", "cells"}; `columns` head the name and the cells."""
    return _templates().get_template("index.html").render(title=title, columns=columns, rows=rows, note=note, up=up)
