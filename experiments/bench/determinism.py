"""Does the embedded llama.cpp server answer the same prompt the same way at temperature 0?

    python -m experiments.bench.determinism --questions 8 --repeats 3
    python -m experiments.bench.determinism --questions 8 --across-threads 2 1

The program's Decomposer (comparison demonstrations, the lean-prefilled layout) decomposes the
first N MuSiQue dev questions, each R times in a row with the LM cache off, once with the
server's prompt cache on (the default) and once with it off (`cache_prompt: false` in every
request). It prints, per setting, how many questions got differing decompositions and the
seconds per call, and each differing question with its outputs. With `--across-threads`, each
question is asked once (prompt cache off) on a server of each thread count instead, and the
questions whose decompositions differ between thread counts are printed: whether a record made
on one machine is what another would compute.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"prompt cache on": {}, "prompt cache off": {"extra_body": {"cache_prompt": False}}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "musique" / "dev.json"))
    parser.add_argument("--across-threads", type=int, nargs="+", metavar="N", help="compare servers of these thread counts instead")
    args = parser.parse_args(argv)

    import dspy

    from modules.lm.predictors import Decomposer
    from pipeline.config import HyperProveConfig
    from pipeline.lm.adapters import make_adapter
    from pipeline.lm.session import make_lm

    questions = [item["question"] for item in json.loads(Path(args.data).read_text())[: args.questions]]
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    decomposer = Decomposer(comparisons=True)
    if args.across_threads:
        return across_threads(decomposer, questions, args.across_threads)
    served = make_lm(HyperProveConfig().lm)
    for setting, extra in SETTINGS.items():
        dspy.configure(lm=served.copy(cache=False, **extra), adapter=make_adapter("lean-prefilled"))
        started = time.perf_counter()
        outputs = [[decomposer.decompose(question=question).sub_questions for _ in range(args.repeats)] for question in questions]
        seconds = (time.perf_counter() - started) / (len(questions) * args.repeats)
        differing = [(question, runs) for question, runs in zip(questions, outputs) if any(run != runs[0] for run in runs[1:])]
        print(f"{setting}: {len(differing)} of {len(questions)} questions got differing decompositions over {args.repeats} "
              f"calls each; {seconds:.2f} s a call", flush=True)
        for question, runs in differing:
            print(f"  {question}\n" + "".join(f"    {run}\n" for run in runs), end="", flush=True)
    return 0


def across_threads(decomposer, questions: list[str], counts: list[int]) -> int:
    """Each question once on a server of each thread count (prompt cache off), compared."""
    import dspy

    from pipeline.config import LMConfig
    from pipeline.lm.adapters import make_adapter
    from pipeline.lm.session import make_lm

    outputs = {}
    for count in counts:
        lm = make_lm(LMConfig(local_cpu_threads=count, deterministic=True))
        dspy.configure(lm=lm.copy(cache=False), adapter=make_adapter("lean-prefilled"))
        started = time.perf_counter()
        outputs[count] = [decomposer.decompose(question=question).sub_questions for question in questions]
        print(f"{count} threads: {(time.perf_counter() - started) / len(questions):.2f} s a call", flush=True)
    differing = [k for k in range(len(questions)) if any(outputs[c][k] != outputs[counts[0]][k] for c in counts[1:])]
    print(f"{len(differing)} of {len(questions)} questions got differing decompositions across {', '.join(map(str, counts))} threads")
    for k in differing:
        print(f"  {questions[k]}\n" + "".join(f"    {c} threads: {outputs[c][k]}\n" for c in counts), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
