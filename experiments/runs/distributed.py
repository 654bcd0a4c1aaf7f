"""An evaluation's LM-bound work on a Ray cluster (`pipeline.lm.cluster`): each LM system's
questions in batches over workers that load the corpus, the index and the embedder once.

The workers share the driver's LM cache (`--cache-dir`, a folder every node sees), so a killed
driver or worker resumes from there without paying a call twice, as a run in one process does;
the driver writes the results folder, the LM call record and the partial folder of finished
systems from the rows and recorded calls the workers hand back.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

from experiments.data import Question
from modules.errors import HyperProveError
from pipeline.index.commands import corpus_passages
from pipeline.index.documents import Reading
from pipeline.lm.cluster import WorkerPool, batches
from pipeline.runtime import apply_library_defaults

BATCH = 4  # questions per task: enough to amortise a task's overhead, few enough to spread a small set


class QuestionWorker:
    """One Ray worker: the corpus, the index, the embedder and an LM session of its own (at the
    endpoint it was given), answering batches of questions for any LM system."""

    def __init__(self, config: dict, index_directory: str | None, make_runtime: Callable):
        """`config` as a dict, at this worker's LM endpoint, its paths absolute."""
        from experiments.harness import make_setup
        from pipeline.config import HyperProveConfig
        from pipeline.index.store import load_index

        apply_library_defaults()
        self.config = HyperProveConfig.from_dict(config)
        self.runtime = make_runtime(self.config)
        passages, _ = corpus_passages(self.config.evaluation.corpus, Reading.of(self.config.index), log=lambda line: None)
        load = (lambda: load_index(index_directory, expect=self.config.index)) if index_directory else None
        self.setup = make_setup(self.config, passages, self.runtime.embedder, load, needs_index=index_directory is not None,
                                    index_label=str(index_directory))
        self.runtime.embedder.load()  # now, not in the first question: a worker is ready when it says so
        self.session = self.runtime.session
        self.programs: dict[str, object] = {}

    def answer(self, system: str, questions: Sequence[Question], sub_queries: dict, program_passages: dict) -> tuple[list[dict], list[dict]]:
        """The rows of a batch of questions, and the LM calls they made (as `CallRecord` rows)."""
        from experiments.harness import lm_system
        from experiments.qa import answer_row

        if system in ("dense-iterative", "hyperprove-passages"):  # they read what the program wrote for these questions
            program = lm_system(self.setup, system, sub_queries, program_passages)
        else:
            if system not in self.programs:
                self.programs[system] = lm_system(self.setup, system, {}, {})
            program = self.programs[system]
        rows = [answer_row(question, program, system=system) for question in questions]
        record = self.session.record
        calls = record.asked_for(system, {q.id for q in questions}) if record is not None else []
        return rows, calls


class RayAnswerer:
    """`experiments.harness.Answerer` on a Ray cluster: each LM system's questions in batches over
    a pool of `QuestionWorker`s; the rows back in question order, the calls they made added to
    the driver's `record`."""

    def __init__(self, config, index_directory: Path | None, make_runtime: Callable, record=None, log: Callable[[str], None] = print):
        index = str(Path(index_directory).resolve()) if index_directory else None
        self.workers = WorkerPool(config, QuestionWorker, index, make_runtime)
        self.record, self.log = record, log
        self.ready_seconds = self.workers.wait_ready()

    def describe(self) -> str:
        return self.workers.describe()

    def __call__(self, system: str, questions: Sequence[Question], sub_queries: dict, program_passages: dict,
                 progress: str | None = None) -> tuple[dict, list[dict]]:
        from tqdm import tqdm

        from experiments.qa import summarize

        if not questions:
            raise HyperProveError("no questions to evaluate")

        def ask(worker, batch):
            texts = {q.question for q in batch}
            return worker.answer.remote(system, batch, {q: v for q, v in sub_queries.items() if q in texts},
                                        {q: v for q, v in program_passages.items() if q in texts})

        rows: dict[str, dict] = {}
        started = time.perf_counter()
        with tqdm(total=len(questions), desc=progress and f"{progress} (ray)", unit="question", disable=progress is None) as bar:
            for batch_rows, calls in self.workers.stream(ask, batches(list(questions), BATCH), system):
                rows.update((row["id"], row) for row in batch_rows)
                if self.record is not None:
                    self.record.add(calls)
                bar.update(len(batch_rows))
        seconds = time.perf_counter() - started
        self.log(f"{system}: {len(questions)} questions in {seconds:.1f} s on {self.workers.workers} Ray workers "
                 f"({60 * len(questions) / seconds:.1f} questions/min; the workers were ready after {self.ready_seconds:.1f} s)")
        ordered = [rows[q.id] for q in questions]
        return summarize(ordered), ordered

    def close(self) -> None:
        self.workers.close()
