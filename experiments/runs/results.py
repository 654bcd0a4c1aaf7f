"""Reading what evaluate runs wrote: their results folders (results.json, predictions.json) and
the questions they name, each file read once. The report, `compare` and `skip_reader` build on it."""

from __future__ import annotations

import functools
from dataclasses import asdict
from pathlib import Path

from experiments.data import load_questions
from modules.errors import HyperProveError
from pipeline.config import HyperProveConfig, ProgramConfig
from pipeline.files import read_json

ROOT = Path(__file__).resolve().parents[2]


DATASET_ORDER = ("musique", "2wiki", "hotpotqa")


RUN_FIELDS = {"systems": dict}  # what the report reads of a results.json without a default


SWEEP_FIELDS = {"config": dict, "study": str, "objective": str, "start_params": dict, "best_params": dict,
                "complete": int, "pruned": int, "n_questions": int, "questions": str}


def read_run_file(path: Path, what: str, needs: dict[str, type]) -> dict:
    """A results.json or sweep.json, checked to hold what the report reads (one line if not)."""
    run = read_json(path, what)
    if not isinstance(run, dict):
        raise HyperProveError(f"{path}: a {what} file holds one JSON object")
    for key, kind in needs.items():
        if not isinstance(run.get(key), kind):
            raise HyperProveError(f"{path}: no {key!r} ({kind.__name__}); not written by `hyperprove {'sweep' if what == 'sweep' else 'evaluate'}`")
    return run


def load_runs(directory: Path) -> list[dict]:
    runs = [{**read_run_file(path, "results", RUN_FIELDS), "results_dir": str(path.parent)} for path in sorted(directory.glob("*/results.json"))
            if not path.parent.name.endswith(".partial")]  # an unfinished run is not a result yet

    def order(run: dict) -> tuple:
        name = run.get("name", "")
        dataset = next((k for k, d in enumerate(DATASET_ORDER) if name.startswith(d)), len(DATASET_ORDER))
        return (run.get("decomposition") == "lm", dataset, name)

    return sorted(runs, key=order)


def system_rows(run: dict, system: str = "hyperprove") -> list[dict] | None:
    """A system's per-question rows of a run (its predictions.json), in question-id order."""
    path = Path(run.get("results_dir", "")) / "predictions.json"
    rows = predictions(str(path)).get(system) if run.get("results_dir") and path.is_file() else None
    return sorted(rows, key=lambda row: row["id"]) if rows else None


@functools.lru_cache(maxsize=None)
def predictions(path: str) -> dict:
    """A run's predictions.json, read once however many comparisons the report draws from it."""
    return read_json(Path(path), "predictions")


def question_types(run: dict) -> dict[str, str]:
    """Question id -> type, of the run's questions ({} when their file is not here)."""
    return {question.id: question.type for question in run_questions(run)}


def run_questions(run: dict) -> list:
    """The run's questions (with their gold steps), from the file it names ([] when it is not here)."""
    return questions_in(str(ROOT / run["questions"])) if run.get("questions") else []


def folder_questions(results_dir: Path) -> list:
    """The questions of a results folder's run, in its questions file's order ([] when it is not here)."""
    return run_questions(read_json(results_dir / "results.json", "results"))


def gold_answers(results_dir: Path) -> dict[str, list[str]]:
    """Question id -> the gold answer and its aliases, for the questions a results folder's run
    names (how `evaluate` scored them), to score other answers to the same questions."""
    return {q.id: [q.answer, *q.answer_aliases] for q in folder_questions(results_dir)}


@functools.lru_cache(maxsize=None)
def questions_in(path: str) -> list:
    """A questions file, read once however many tables and verdicts of the report use it (its
    evidence quotes unlocated: the report reads types, answers and gold steps, not passages)."""
    return load_questions(path, locate_quotes=False) if Path(path).is_file() else []


def _recorded(run: dict) -> tuple[HyperProveConfig, dict]:
    """The config a run ran with (a field its record lacks: what runs went without it), and the
    retired options it had on, as recorded (`ProgramConfig.RETIRED`)."""
    recorded = run.get("config", {})
    program = recorded.get("program", {}) if isinstance(recorded.get("program"), dict) else {}
    retired = {name: value for name, value in program.items() if name in ProgramConfig.RETIRED and value != ProgramConfig.RETIRED[name]}
    current = {**recorded, "program": {name: value for name, value in program.items() if name not in ProgramConfig.RETIRED}} if program else recorded
    return HyperProveConfig.from_record(current, source=f"{run.get('results_dir', run['name'])}/results.json"), retired


def recorded_program(run: dict) -> dict:
    """The program settings a run ran with, and its LM adapter; a retired option it had on is among them."""
    config, retired = _recorded(run)
    return {**asdict(config.program), **retired, "adapter": config.lm.layout}


def recorded_retriever(run: dict) -> dict:
    """The retriever settings a run ran with (a field its record lacks: what runs went without it)."""
    return _recorded(run)[0].retriever.to_dict()


def recorded_index(run: dict) -> dict:
    """The index settings a run ran with (`sentence_rules` 1 for a record made before they existed)."""
    return asdict(_recorded(run)[0].index)
