"""Evidence-chain pages of a results folder, generated from what the folder keeps.

A run's pages follow from its predictions.json and the questions and corpus its results.json
names (checked by sha256; a folder corpus by its passages), so they are written on demand instead of kept beside the run:
`hyperprove pages FOLDER` writes `FOLDER/pages/` (or `--out DIR`), byte for byte what the
evaluation wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.data import load_questions
from experiments.runs.failures import write_pages
from experiments.runs.reproduce import check_data, read_recorded
from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig
from pipeline.files import atomic_directory
from pipeline.index.corpus import load_corpus


def run_pages(folder: str | Path, out: str | Path | None = None, log=print) -> dict:
    """Write the evidence-chain pages of the run in `folder` to `out` (default `folder/pages`);
    returns the folder written and the number of question pages."""

    folder = Path(folder)
    if not folder.is_dir():
        raise HyperProveError(f"{folder}: no such results folder")
    results = read_recorded(folder, str(folder))["results"]
    config = HyperProveConfig.from_record(results["config"])
    passages = check_data(results, config, str(folder), "no pages written")
    predictions = folder / "predictions.json"
    try:
        rows = json.loads(predictions.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HyperProveError(f"{folder}: has no predictions.json") from None
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise HyperProveError(f"{predictions}: is not valid JSON") from None
    if not isinstance(rows, dict) or not all(isinstance(r, list) and all(isinstance(x, dict) for x in r) for r in rows.values()):
        raise HyperProveError(f"{predictions}: is not an object of systems, each a list of answer rows")
    passages = passages or load_corpus(config.evaluation.corpus)
    questions = load_questions(config.evaluation.questions, passages)
    known = {question.id for question in questions}
    if missing := next((row.get("id") for r in rows.values() for row in r if row.get("id") not in known), None):
        raise HyperProveError(f"{predictions}: question {missing!r} is not in {config.evaluation.questions}")
    target = Path(out) if out is not None else folder / "pages"
    with atomic_directory(target) as scratch:
        written = write_pages(scratch, rows, questions, [passage.title for passage in passages])
        if not written:  # (leaves `target` as it was)
            raise HyperProveError(f"{folder}: no system of this run answered questions, so it has no evidence-chain pages")
    log(f"{written} evidence-chain pages in {target}/ (index: {target / 'index.html'})")
    return {"pages": str(target), "questions": written}
