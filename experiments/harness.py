"""The evaluation harness: several systems on one question set in one run, sharing one corpus,
one embedder, one index and one LM, under one evidence budget (the top 5 passages).

Two settings:
- `gold` (no LM): every system ranks passages; Recall@2/@5 and seconds per question. The
  decomposed systems (`dense-iterative`, `hyperprove`) take MuSiQue's gold sub-questions.
- `lm`: `hyperprove` is the full program (LM decomposition, rewriting, hop answers, final
  answer); `dense-iterative` searches the program's own rewritten sub-queries, so the two
  differ only in retrieval; the question-only systems rank from the question. With `read`
  (the default) every system other than `hyperprove` also hands its top 5 passages to the
  program's final reader, for EM/F1 under the same reader; `hyperprove-passages` hands over
  the program's own top 5, which tells its retrieval apart from the rest of its answer path.

Each system gives a summary (the table row) and one row per question (answer, ranked passages,
evidence chain); `write_results` writes the table as markdown and JSON plus the predictions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

from experiments.baselines import BeamPathSearch, DenseFactSearch, EntityExpansionSearch, PPRPassageSearch
from experiments.data import Question
from experiments.gold import DensePassageSearch, evaluate_ranker, gold_sub_queries, hyperprove_chain
from experiments.metrics import per_type
from experiments.qa import PassageReader, evaluate_program
from experiments.runs.failures import failure_summary, failure_table, page_link
from modules.errors import HyperProveError
from modules.lm.predictors import EVIDENCE_PASSAGES
from modules.retrieval.retriever import interleave_passages
from pipeline.files import atomic_write_bytes, atomic_write_json
from pipeline.index.build import corpus_checksum
from pipeline.lm.profile import profile_table
from pipeline.lm.record import RECORD_FILE
from pipeline.program import load_compiled, program_for

# name -> what it is (the CLI help and the report print these)
SYSTEMS = {
    "dense": "passages nearest to the question (exact cosine)",
    "bm25": "BM25 over passages (bm25s, Lucene variant)",
    "ppr": "HippoRAG 2-style Personalized PageRank over entities and passages",
    "proprag": "PropRAG-style beam search over fact paths, then PPR",
    "dense-facts": "passages of the facts nearest to the question",
    "hypergraphrag": "HyperGraphRAG-style one-shot expansion from matched entities",
    "hyperprove-fixed": "ablation: HyperProve's expansion on the fixed question, no carried frontier",
    "dense-iterative": "dense passages per sub-question, hops interleaved",
    "hyperprove": "answer-guided hypergraph expansion hop by hop (the method)",
    "hyperprove-passages": "with the LM: hyperprove's top 5 passages through the same reader as the peers",
}
QUESTION_ONLY = ("bm25", "ppr", "proprag", "dense-facts", "hypergraphrag", "hyperprove-fixed")
DECOMPOSED = ("dense-iterative", "hyperprove")
PASSAGE_LEVEL = ("dense", "dense-iterative", "bm25")  # need no hypergraph index
AFTER_PROGRAM = ("dense-iterative", "hyperprove-passages")  # with the LM, these read what the program wrote


def parse_systems(names: str | Sequence[str]) -> list[str]:
    """"dense,ppr" or a list -> known names, de-duplicated, in the order given."""
    listed = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    listed = [n for n in dict.fromkeys(listed) if n]
    if not listed:
        raise HyperProveError("--retriever: name at least one system")
    for name in listed:
        if name not in SYSTEMS:
            raise HyperProveError(f"--retriever {name!r}: choose from {', '.join(SYSTEMS)}")
    return listed


def run_order(names: Sequence[str], decomposition: str, read: bool = True) -> list[str]:
    """With the LM, `dense-iterative` reuses the program's sub-queries and `hyperprove-passages`
    its passages, so `hyperprove` runs first."""
    if "hyperprove-passages" in names and not (decomposition == "lm" and read):
        raise HyperProveError("hyperprove-passages hands the program's passages to the reader: use it with --decomposition lm and the reader on")
    following = [name for name in AFTER_PROGRAM if name in names]
    if decomposition == "lm" and following:
        if "hyperprove" not in names:
            raise HyperProveError(f"--decomposition lm: {following[0]} reads what hyperprove wrote; list hyperprove too")
        return ["hyperprove", *[n for n in names if n != "hyperprove"]]
    return list(names)


class EvaluationSetup:
    """What the systems of one run share: the corpus, the config, the embedder, and the index and
    dense passage search, each built on first use; programs and readers come from factories the
    caller supplies (the command line loads compiled prompts into them)."""

    def __init__(self, passages, config, embedder, load_index: Callable[[], object], make_program: Callable[[object], object] | None = None,
                 prepare_reader: Callable[[object], object] = lambda reader: reader, needs_index: bool = True,
                 index_label: str = "the index"):
        self.passages, self.config, self.embedder, self.index_label = passages, config, embedder, index_label
        self._load_index, self._make_program, self._prepare_reader = load_index, make_program, prepare_reader
        self.needs_index = needs_index

    @cached_property
    def index(self):
        """The hypergraph index, checked to be built from this run's corpus."""

        index = self._load_index()
        checksum = corpus_checksum(self.passages)
        if index.info.get("corpus_sha256") != checksum:
            earlier = [g["generation"] for g in index.info.get("generations", []) if g.get("corpus_sha256") == checksum]
            if earlier:
                raise HyperProveError(f"{self.index_label}: the corpus evaluated is the one of its generation {earlier[-1]}, but passages were "
                                      f"added or deleted since (it is at generation {index.generation}); evaluate it with the corpus it holds now")
            raise HyperProveError(f"{self.index_label}: built from another corpus than the one evaluated (corpus checksums differ)")
        return index

    @cached_property
    def dense(self) -> DensePassageSearch:
        """Over the index's passage vectors when there is an index: one embedding pass per run."""
        if self.needs_index:
            passage_index = self.index.passage_index
        else:
            from pipeline.index.build import vector_index

            vectors = self.embedder.encode([p.titled_text for p in self.passages], progress="embed passages")
            passage_index = vector_index(vectors, self.config.index)
        return DensePassageSearch(passage_index, self.embedder.encode_query)

    def search(self, name: str) -> Callable[[str], list[int]]:
        """The passage search of a question-only system (or `dense`)."""
        if name == "dense":
            return self.dense
        if name == "bm25":
            from experiments.baselines import BM25PassageSearch

            return BM25PassageSearch(self.passages)

        encode, index = self.embedder.encode_query, self.index
        if name == "ppr":
            return PPRPassageSearch.from_index(index, encode)
        if name == "proprag":
            return BeamPathSearch.from_index(index, encode)
        if name == "dense-facts":
            return DenseFactSearch(index.fact_index, index.fact_passage, encode)
        if name == "hypergraphrag":
            return EntityExpansionSearch.from_index(index, encode)
        if name == "hyperprove-fixed":
            retriever = index.retriever(self.config.retriever, encode)
            return lambda query: retriever(query).passages
        raise HyperProveError(f"{name!r} is not a question-only system")

    def program(self):
        if self._make_program is None:
            raise HyperProveError("the full program needs an LM (--decomposition lm)")
        return self._make_program(self.index)

    def reader(self, search: Callable[[str], list[int]]):
        """A system's top passages read by the program's final reader (compiled, when given)."""

        return self._prepare_reader(PassageReader(search, self.passages, EVIDENCE_PASSAGES, choose=self.config.program.choose_options,
                                                  encode=self.embedder.encode_query))


def make_setup(config, passages, embedder, load_index: Callable | None, needs_index: bool, index_label: str):
    """The `EvaluationSetup` of an evaluation: with the LM, programs over its index's retriever and
    readers with the compiled prompts loaded (a Ray worker builds the same one)."""

    with_lm = config.evaluation.decomposition == "lm"
    return EvaluationSetup(
        passages, config, embedder, load_index,
        make_program=(lambda index: program_for(index.retriever(config.retriever, embedder.encode_query), config)) if with_lm else None,
        prepare_reader=lambda module: load_compiled(module, config.program.compiled),
        needs_index=needs_index, index_label=index_label,
    )


@dataclass
class SystemResult:
    name: str
    summary: dict
    rows: list[dict] = field(default_factory=list)


Answerer = Callable[..., tuple[dict, list[dict]]]  # (system, questions, sub-queries, program passages, progress) -> (summary, rows)


def evaluate_systems(
    names: Sequence[str],
    questions: Sequence[Question],
    setup: EvaluationSetup,
    decomposition: str = "gold",
    read: bool = False,
    progress: bool = True,
    finished: dict[str, SystemResult] | None = None,
    on_result: Callable[[dict[str, SystemResult]], None] | None = None,
    trace: Callable | None = None,
    answer: Answerer | None = None,
) -> dict[str, SystemResult]:
    """Run each system on the questions; results in the order the names were given. Systems in
    `finished` (an interrupted run's) are taken as they are; `on_result` sees the results so far
    after each system, so a long run can keep them; every question that calls the LM runs in
    `trace(question, system)` (`Runtime.question_trace`) when one is given. `answer` answers the
    LM systems' questions elsewhere (`experiments.runs.distributed.RayAnswerer`); by default, here."""

    if decomposition not in ("gold", "lm"):
        raise HyperProveError(f"decomposition {decomposition!r}: choose gold or lm")
    if decomposition == "gold":
        for name in names:
            if name in DECOMPOSED:
                missing = [q.id for q in questions if not q.decomposition]
                if missing:
                    raise HyperProveError(
                        f"{name} with --decomposition gold needs gold sub-questions; question {missing[0]} has none "
                        "(MuSiQue and 2Wiki carry them: use --decomposition lm, or hyperprove-fixed)"
                    )
    types = {q.id: q.type for q in questions if q.type}
    results: dict[str, SystemResult] = {}
    sub_queries: dict[str, list[str]] = {}
    program_passages: dict[str, list[int]] = {}
    for name in run_order(names, decomposition, read):
        label = name if progress else None
        setup.embedder.forget_queries()  # each system's timing includes embedding its own queries
        if name in (finished or {}):
            summary, rows = finished[name].summary, finished[name].rows
        elif decomposition == "lm" and (name == "hyperprove" or read):
            if answer is not None:
                summary, rows = answer(name, questions, sub_queries, program_passages, label)
            else:
                system = lm_system(setup, name, sub_queries, program_passages)
                summary, rows = evaluate_program(questions, system, progress=label, trace=trace, system=name)
        else:
            summary, rows = evaluate_ranker(questions, passage_ranker(setup, name, decomposition, sub_queries), progress=label)
        if name == "hyperprove" and decomposition == "lm":  # what the systems after the program read
            sub_queries = {row["question"]: [hop["query"] for hop in row["chain"]] or [row["question"]] for row in rows}
            program_passages = {row["question"]: row["passages"] for row in rows}
        if types:
            summary = {**summary, "per_type": per_type(rows, types)}
        if failures := failure_summary(rows, questions):
            summary = {**summary, "failures": failures}
        results[name] = SystemResult(name, {"system": name, **summary}, rows)
        if on_result is not None:
            on_result(results)
    return {name: results[name] for name in names}


def lm_system(setup: EvaluationSetup, name: str, sub_queries: dict[str, list[str]], program_passages: dict[str, list[int]]):
    """What a system answers with under the LM: the program (`hyperprove`), or the final reader
    over the system's top passages; `dense-iterative` searches the program's sub-queries and
    `hyperprove-passages` takes the program's passages (both keyed by the question's text)."""
    if name == "hyperprove":
        return setup.program()
    if name == "dense-iterative":
        search = _iterative_search(setup.dense, sub_queries)
    elif name == "hyperprove-passages":
        search = lambda question: program_passages.get(question, [])  # noqa: E731 - the program's own top passages
    else:
        search = setup.search(name)
    return setup.reader(search)


def iterative_dense(dense: DensePassageSearch, queries: Sequence[str]) -> list[int]:
    """`dense-iterative`: dense passages for each sub-query, the hops interleaved rank by rank."""
    return interleave_passages([dense(query) for query in queries])


def _iterative_search(dense: DensePassageSearch, sub_queries: dict[str, list[str]]) -> Callable[[str], list[int]]:
    """Dense search on the sub-queries the program wrote for this question (keyed by its text)."""
    return lambda question: iterative_dense(dense, sub_queries.get(question, [question]))


def passage_ranker(setup: EvaluationSetup, name: str, decomposition: str, sub_queries: dict[str, list[str]]):
    """Question -> (ranked passages, evidence chain) for the retrieval-only setting."""
    if name == "hyperprove":
        retriever = setup.index.retriever(setup.config.retriever, setup.embedder.encode_query)
        return lambda question: hyperprove_chain(question, retriever)
    if name == "dense-iterative":
        dense = setup.dense

        def iterative(question: Question):
            queries = gold_sub_queries(question) if decomposition == "gold" else sub_queries.get(question.question, [question.question])
            return iterative_dense(dense, queries), [{"query": q} for q in queries]

        return iterative
    search = setup.search(name)
    return lambda question: (search(question.question), [])


# --- results -------------------------------------------------------------------------------------
COLUMNS = (
    ("recall@2", "R@2", "{:.2f}"), ("recall@5", "R@5", "{:.2f}"), ("em", "EM", "{:.2f}"), ("f1", "F1", "{:.2f}"),
    ("lm_calls_per_question", "LM calls/q", "{:.2f}"), ("cached_calls_per_question", "of them cached/q", "{:.2f}"),
    ("prompt_tokens_per_question", "prompt tok/q", "{:.0f}"),
    ("completion_tokens_per_question", "gen tok/q", "{:.0f}"), ("seconds_per_question", "s/q", "{:.4g}"),
    ("retrieval_ms_per_question", "retrieval ms/q", "{:.1f}"), ("planned_by_rule", "planned by rule", "{:d}"),
    ("answered_by_rule", "answered by rule", "{:d}"), ("documentation_demos", "documentation demos", "{:d}"),
)


def with_cached_calls(summaries: Sequence[dict]) -> list[dict]:
    """The summaries with the LM calls a question that the LM cache or a replayed record answered
    (`cached_calls_per_question`) where any system had some: such calls take no LM time, so the
    s/q beside them is not what the LM costs."""
    if not any(summary.get("lm_cache_hits") for summary in summaries):
        return list(summaries)
    return [{**summary, "cached_calls_per_question": round(summary["lm_cache_hits"] / summary["n"], 2) if "lm_cache_hits" in summary else None}
            for summary in summaries]


def results_table(summaries: Sequence[dict]) -> str:
    """A markdown table, one row per system; "–" where a metric does not apply, and no column
    that applies to no system (a run recorded before tokens were counted has no token columns)."""
    summaries = with_cached_calls(summaries)
    columns = [(key, title, fmt) for key, title, fmt in COLUMNS if any(s.get(key) is not None for s in summaries)]
    lines = ["| system | n | " + " | ".join(title for _, title, _ in columns) + " |", "|---|---:|" + "---:|" * len(columns)]
    for summary in summaries:
        cells = [fmt.format(summary[key]) if summary.get(key) is not None else "–" for key, _, fmt in columns]
        lines.append(f"| {summary['system']} | {summary['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


TYPE_SCORES = (("f1", "F1"), ("recall@2", "Recall@2"), ("recall@5", "Recall@5"))


def per_type_tables(summaries: Sequence[dict]) -> str:
    """Per score (F1 where there is a reader, Recall@2, Recall@5), one table: a row per system, a
    column per question type (with its number of questions)."""
    typed = [s for s in summaries if s.get("per_type")]
    sections = [f"\n## {title} by question type\n\n" + "\n".join(type_table(typed, score)) + "\n"
                for score, title in TYPE_SCORES if any(score in scores for s in typed for scores in s["per_type"].values())]
    return "".join(sections)


def type_table(typed: Sequence[dict], score: str) -> list[str]:
    """Markdown lines: a row per system (summaries with `per_type`), a column per question type
    (with its number of questions), `score` in each cell ("–" where a system lacks the type)."""
    kinds = list(dict.fromkeys(kind for s in typed for kind in s["per_type"]))
    counts = {kind: next(s["per_type"][kind]["n"] for s in typed if kind in s["per_type"]) for kind in kinds}
    lines = ["| system | " + " | ".join(f"{kind} ({counts[kind]})" for kind in kinds) + " |", "|---|" + "---:|" * len(kinds)]
    for s in typed:
        cells = [f"{s['per_type'][kind][score]:.2f}" if score in s["per_type"].get(kind, {}) else "–" for kind in kinds]
        lines.append(f"| {s['system']} | " + " | ".join(cells) + " |")
    return lines


def lm_module_tables(summaries: Sequence[dict]) -> str:
    """Per system that called the LM, what each LM module cost per question (means)."""

    sections = [f"\n## {summary['system']}: LM modules, per question\n\n" + profile_table(summary["lm_steps"])
                + (f"\n{summary['lm_cache_hits']} calls came from DSPy's cache, so seconds understate the LM's cost.\n" if summary.get("lm_cache_hits") else "")
                for summary in summaries if summary.get("lm_steps")]
    return "".join(sections)


def write_results(directory: str | Path, header: dict, results: dict[str, SystemResult], record=None) -> dict[str, Path]:
    """results.md (the table), results.json (header + summaries), predictions.json (rows), and with
    `record` (a `pipeline.lm.record.CallRecord`) the LM calls, named in results.json; atomically."""

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if record is not None:
        header = {**header, "lm_calls": record.write(directory / RECORD_FILE)}
    summaries = [r.summary for r in results.values()]
    title = f"# {header.get('name', 'evaluation')}\n\n{header.get('description', '')}\n\n".replace("\n\n\n", "\n\n")
    paths = {"table": directory / "results.md", "results": directory / "results.json", "predictions": directory / "predictions.json"}
    atomic_write_bytes(paths["table"], (title + results_table(summaries) + per_type_tables(summaries) + failure_table(summaries, page_link())
                                              + lm_module_tables(summaries)).encode())
    atomic_write_json(paths["results"], {**header, "systems": {r.name: r.summary for r in results.values()}})
    atomic_write_json(paths["predictions"], {r.name: r.rows for r in results.values()})
    if record is not None:
        paths["lm_calls"] = directory / RECORD_FILE
    return paths


def timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())
