"""What one MLflow trace per question costs: the program on a scripted LM, traced and not.

    python -m experiments.bench.tracing [--questions 30]

A scripted LM (DSPy's DummyLM) answers at once, so the figures are tracing's own cost per
question (spans for every module and LM call, their inputs and outputs) and the time to write
the traces to a fresh SQLite store at the end; set them against the 20-35 s a question takes on
the embedded model. With the real LM, compare `hyperprove evaluate` with and without `--no-trace`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from modules.facts import Passage
from pipeline.runtime import no_trace
from pipeline.traces import QuestionTraces

ROOT = Path(__file__).resolve().parents[2]

QUESTION = "When did the mother of the director of Jaws die?"
CORPUS = [
    ("Jaws (film)", "Jaws is a 1975 thriller film. Jaws was directed by Steven Spielberg."),
    ("Steven Spielberg", "Steven Spielberg is an American film director. Steven Spielberg's mother was Leah Adler."),
    ("Leah Adler", "Leah Adler was an American restaurateur. Leah Adler died in 2017."),
    ("Ohio River", "The Ohio River is a tributary of the Mississippi River."),
]
SCRIPT = {  # what identifies each prompt -> the scripted answer
    "`[[ ## sub_questions ## ]]`": {"sub_questions": ["Who directed Jaws?", "Who was the mother of #1?", "When did #2 die?"]},
    "[[ ## sub_question ## ]]\nWho was the mother of #1?": {"question": "Who was the mother of Steven Spielberg?"},
    "[[ ## sub_question ## ]]\nWhen did #2 die?": {"question": "When did Leah Adler die?"},
    "[[ ## question ## ]]\nWho directed Jaws?\n\n": {"answer": "Steven Spielberg", "supporting": [1]},
    "[[ ## question ## ]]\nWho was the mother of Steven Spielberg?\n\n": {"answer": "Leah Adler", "supporting": [1]},
    "[[ ## question ## ]]\nWhen did Leah Adler die?\n\n": {"answer": "2017", "supporting": [1]},
    f"[[ ## question ## ]]\n{QUESTION}\n\n": {"answer": "2017"},
}


def main(argv: list[str] | None = None) -> int:
    import dspy
    from dspy.utils import DummyLM

    from modules.config import RetrieverConfig
    from pipeline.config import IndexConfig, ProgramConfig, TrackingConfig
    from pipeline.index.build import build_index
    from pipeline.index.embedder import Embedder
    from pipeline.program import HyperProve

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=30)
    args = parser.parse_args(argv)
    embedder = Embedder(IndexConfig().embedder)
    index = build_index([Passage(title, text) for title, text in CORPUS], IndexConfig(), embedder, progress=False)
    program = HyperProve(index.retriever(RetrieverConfig(top_k=2, n_seeds=3), embedder.encode_query), ProgramConfig())

    def seconds_per_question(context) -> float:
        times = []
        with dspy.context(lm=DummyLM(SCRIPT)):
            for _ in range(args.questions + 5):  # the first five warm up
                started = time.perf_counter()
                with context(QUESTION, "hyperprove") as finish:
                    prediction = program(QUESTION)
                    finish(prediction.answer, prediction.fallbacks, {"em": 1.0})
                times.append(time.perf_counter() - started)
        return statistics.median(times[5:])

    plain = seconds_per_question(no_trace)
    store = Path(tempfile.mkdtemp())
    traces = QuestionTraces(TrackingConfig(uri=f"sqlite:///{store}/mlflow.db", artifacts=str(store / "artifacts")))
    traced = seconds_per_question(traces.question)
    started = time.perf_counter()
    written = traces.close()
    flushed = time.perf_counter() - started
    print(f"median per question: untraced {1000 * plain:.1f} ms, traced {1000 * traced:.1f} ms "
          f"(+{1000 * (traced - plain):.1f} ms); writing the {written} traces at the end: {1000 * flushed / written:.0f} ms a trace")
    return 0


if __name__ == "__main__":
    sys.exit(main())
