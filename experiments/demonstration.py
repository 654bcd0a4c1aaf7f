"""`hyperprove demo`: index the small corpus shipped in `experiments/demo/` and answer its
multi-hop questions, showing each evidence chain (the LM extractor unless told otherwise).

The embedded model's extraction of the demo corpus ships in `experiments/demo/facts.json`, so the
demo reaches its first answer without minutes of extraction; `hyperprove demo --write-facts`
makes it again. Another LM (or extractor version) extracts live: the file names the LM that made it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

from experiments.data import load_questions
from experiments.metrics import exact_match
from pipeline.index.corpus import load_corpus
from pipeline.runtime import Runtime

DEMO_DIR = Path(__file__).resolve().parent / "demo"
DEMO_FACTS = DEMO_DIR / "facts.json"


def run_demo(config, runtime=None, log: Callable[[str], None] = print) -> dict:
    from pipeline.index.extract import seed_extracted_facts
    from pipeline.index.store import cached_index
    from pipeline.program import program_for
    from pipeline.serve.ask import answer_record, format_chain

    started = time.perf_counter()
    program = program_for(None, config)  # a bad --program fails before any work
    passages = load_corpus(DEMO_DIR / "corpus.json")
    questions = load_questions(DEMO_DIR / "questions.json", passages)
    log(f"demo: {len(passages)} passages ({DEMO_DIR / 'ATTRIBUTION.md'}), {len(questions)} questions, LM {config.lm.id}")
    runtime = runtime or Runtime(config)
    session = runtime.session
    if config.index.extractor == "lm" and (seeded := seed_extracted_facts(DEMO_FACTS, passages, config.cache_dir, session.id)):
        log(f"facts of {seeded} passages: extracted earlier by {session.id}, from {DEMO_FACTS} (`hyperprove demo --write-facts` makes them again)")
    index, _ = cached_index(passages, config, runtime, log)
    log(f"index: {index.counts()} ({time.perf_counter() - started:.0f} s)")
    program.retriever = index.retriever(config.retriever, runtime.embedder.encode_query)
    answers = []
    for number, question in enumerate(questions, start=1):
        asked = time.perf_counter()
        with runtime.question_trace(question.question) as finish:
            prediction = program(question.question)
            finish(prediction.answer, prediction.fallbacks, {"gold_answer": question.answer})
        correct = bool(exact_match(prediction.answer, [question.answer, *question.answer_aliases]))
        log(f"\n[{number}/{len(questions)}] {question.question}")
        log("\n".join(format_chain(prediction)))
        log(f"A: {prediction.answer}   (gold: {question.answer}{'' if correct else ', not matched'}; {time.perf_counter() - asked:.0f} s)")
        answers.append({**answer_record(question.question, prediction), "gold": question.answer, "exact_match": correct})
    seconds = time.perf_counter() - started
    if runtime.traces_started:
        log(f"{runtime.traces.close()} question traces in MLflow experiment {config.tracking.experiment!r} (`hyperprove ui` shows them)")
    log(f"\ndemo done in {seconds:.0f} s, {session.calls()} LM calls; run it again and the caches make it fast")
    return {"answers": answers, "index": index.counts(), "lm": session.id, "lm_calls": session.calls(), "seconds": round(seconds, 2)}


def write_demo_facts(config, runtime=None, log: Callable[[str], None] = print) -> dict:
    """Extract the demo corpus with the configured LM afresh (past the extraction cache, not
    past DSPy's) and write `experiments/demo/facts.json`."""

    from pipeline.index.extract import describe_extraction, make_extractor, write_extracted_facts

    passages = load_corpus(DEMO_DIR / "corpus.json")
    session = (runtime or Runtime(config)).session
    with tempfile.TemporaryDirectory() as scratch:
        extractor = make_extractor("lm", session.lm, session.id, scratch, config.lm.concurrency)
        extractor.extract(passages, progress=True)
        for line in describe_extraction(extractor):
            log(line)
        shipped = write_extracted_facts(DEMO_FACTS, passages, scratch, session.id)
    facts = sum(len(row["facts"]) for row in shipped["passages"])
    log(f"wrote {DEMO_FACTS}: {facts} facts of {len(passages)} passages, by {session.id}")
    return {"out": str(DEMO_FACTS), "passages": len(passages), "facts": facts, "lm": session.id}
