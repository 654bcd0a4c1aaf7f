"""`hyperprove demo`: index the small corpus shipped in `experiments/demo/` and answer its
multi-hop questions, showing each evidence chain (the LM extractor unless told otherwise)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

DEMO_DIR = Path(__file__).resolve().parent / "demo"


def run_demo(config, runtime=None, log: Callable[[str], None] = print) -> dict:
    from experiments.data import load_questions
    from experiments.metrics import exact_match
    from pipeline.corpus import load_corpus
    from pipeline.index import cached_index
    from pipeline.program import answer_record, format_chain, program_for
    from pipeline.runtime import Runtime

    started = time.perf_counter()
    program = program_for(None, config)  # a bad --program fails before any work
    passages = load_corpus(DEMO_DIR / "corpus.json")
    questions = load_questions(DEMO_DIR / "questions.json", passages)
    log(f"demo: {len(passages)} passages ({DEMO_DIR / 'ATTRIBUTION.md'}), {len(questions)} questions, LM {config.lm.id}")
    runtime = runtime or Runtime(config)
    session = runtime.session
    index, _ = cached_index(passages, config, runtime, log)
    log(f"index: {index.counts()} ({time.perf_counter() - started:.0f} s)")
    program.retriever = index.retriever(config.retriever, runtime.embedder.encode_query)
    answers = []
    for number, question in enumerate(questions, start=1):
        asked = time.perf_counter()
        prediction = program(question.question)
        correct = bool(exact_match(prediction.answer, [question.answer, *question.answer_aliases]))
        log(f"\n[{number}/{len(questions)}] {question.question}")
        log("\n".join(format_chain(prediction)))
        log(f"A: {prediction.answer}   (gold: {question.answer}{'' if correct else ', not matched'}; {time.perf_counter() - asked:.0f} s)")
        answers.append({**answer_record(question.question, prediction), "gold": question.answer, "exact_match": correct})
    seconds = time.perf_counter() - started
    log(f"\ndemo done in {seconds:.0f} s, {session.calls()} LM calls; run it again and the caches make it fast")
    return {"answers": answers, "index": index.counts(), "lm": session.id, "lm_calls": session.calls(), "seconds": round(seconds, 2)}
