"""Asking: one question over a saved index, as the command line's `ask` and the server answer it,
with the evidence chain as lines and as a record."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import dspy

from modules.errors import HyperProveError
from pipeline.files import atomic_write_bytes
from pipeline.index.corpus import text_problem
from pipeline.index.store import load_index
from pipeline.lm.profile import profile_table
from pipeline.program import program_for
from pipeline.runtime import Runtime
from pipeline.scope import scoped
from pipeline.serve.pages import chain_page


def format_chain(prediction: dspy.Prediction) -> list[str]:
    """The evidence chain as lines: per hop the sub-question, the query, the facts, the answer;
    `*` marks the facts the hop reader cited."""
    lines = []
    for hop in prediction.chain:
        lines.append(f"  hop {hop['hop']}: {hop['sub_question']}")
        if hop["query"] != hop["sub_question"]:
            lines.append(f"    rewritten: {hop['query']}")
        for fact in hop["facts"]:
            mark = "*" if fact["id"] in hop["supporting"] else " "
            lines.append(f"   {mark}[{fact['score']:.3f}] ({fact['title']}) {fact['text']}")
        lines.append(f"    -> {hop['answer']}")
    if prediction.get("by_rule"):
        lines.append(f"  answered by rule: {prediction.by_rule}")
    for note in prediction.fallbacks:
        lines.append(f"  fallback: {note}")
    return lines


def answer_record(question: str, prediction: dspy.Prediction) -> dict:
    return {"question": question, "answer": prediction.answer, "chain": prediction.chain, "fallbacks": prediction.fallbacks,
            **({"answer_before_choice": prediction.answer_before_choice} if prediction.get("answer_before_choice") is not None else {}),
            **({"by_rule": prediction.by_rule} if prediction.get("by_rule") else {})}


class Asker:
    """A saved index and the program of a config, loaded once, answering questions: one for
    `ask`, many (from several threads at once) for `serve`."""

    def __init__(self, config, index_directory: str | Path, runtime=None):
        self.runtime = runtime or Runtime(config)
        self.program = program_for(None, config)  # a bad --program fails before the index and the LM load
        self.index = load_index(index_directory, expect_embedder=config.index.embedder)
        self.program.retriever = self.index.retriever(config.retriever, self.runtime.embedder.encode_query)
        self.titles = [passage.title for passage in self.index.passages]
        self.passage_sources = [passage.source for passage in self.index.passages]  # "file#chunk" for a folder's passages
        # the LM, the embedder and the traces now, in this thread: DSPy is configured by the thread
        # that starts it, and questions answered in several threads share one of each
        self.runtime.session, self.runtime.traces
        self.runtime.embedder.load()
        if config.retriever.lexical:
            self.index.lexical  # BM25 over the facts now, not while the first question waits

    def __call__(self, question: str, listener: Callable[[str, dict], None] | None = None) -> tuple[dict, dspy.Prediction]:
        """The answer record (the chain, the top passages with their text and files, what its LM
        calls cost) and the prediction; `listener` hears the plan and each hop as they come. The
        question's scope (`pipeline.scope`) keeps both its own while others are answered in other
        threads."""
        if not question.strip():
            raise HyperProveError("the question is empty")
        session = self.runtime.session
        started = time.perf_counter()
        with scoped(listener=listener, costs={}) as scope, self.runtime.question_trace(question) as finish:
            prediction = self.program(question)
            finish(prediction.answer, prediction.fallbacks)
        spent = {module: asdict(cost) for module, cost in scope.spent().items()}
        record = {**answer_record(question, prediction), "passages": list(prediction.passages),
                  "sources": self.sources(prediction.passages[:5]), "lm": session.id,
                  "lm_calls": sum(cost["calls"] for cost in spent.values()), "lm_steps": spent,
                  "seconds": round(time.perf_counter() - started, 2)}
        return record, prediction

    def sources(self, passages) -> list[dict]:
        """Passages as the answer's reader sees them: id, title, text, and the file they came from."""
        return [{"id": int(p), "title": passage.title, "text": passage.text, **({"source": passage.source} if passage.source else {})}
                for p in passages for passage in [self.index.passages[p]]]


def ask(config, index_directory: str, question: str, runtime=None, log=print, profile: bool = False, html: str | None = None) -> dict:
    """Answer one question over a saved index with the program of `config`; logs the chain, with
    `profile` what each LM module cost (calls, tokens, tokens from the prompt cache, seconds), with
    `html` writes the chain as an evidence-chain page to that file, and with tracking on logs the
    question as one MLflow trace."""

    if not question.strip():
        raise HyperProveError("the question is empty")
    if problem := text_problem(question):
        raise HyperProveError(f"the question {problem}")
    if html and Path(html).is_dir():
        raise HyperProveError(f"--html {html}: is a folder; name the page file to write")
    asker = Asker(config, index_directory, runtime)
    record, prediction = asker(question)
    traced = asker.runtime.traces.close() if asker.runtime.traces_started else 0
    log(f"Q: {question}")
    log("\n".join(format_chain(prediction)))
    log(f"A: {prediction.answer}")
    if profile:
        log(profile_table(record["lm_steps"]).rstrip())
    if html:
        atomic_write_bytes(Path(html), chain_page(record, asker.titles, sources=asker.passage_sources).encode())
        log(f"evidence chain: {html}")
    if traced:
        log(f"trace: in MLflow experiment {config.tracking.experiment!r} of {config.tracking.uri} (`hyperprove ui` shows it)")
    return record
