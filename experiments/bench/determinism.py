"""Does the embedded llama.cpp server answer the same prompt the same way at temperature 0?

    python -m experiments.bench.determinism --questions 8 --repeats 3

The program's Decomposer (comparison demonstrations, the lean-prefilled layout) decomposes the
first N MuSiQue dev questions, each R times in a row with the LM cache off, once with the
server's prompt cache on (the default) and once with it off (`cache_prompt: false` in every
request). It prints, per setting, how many questions got differing decompositions and the
seconds per call, and each differing question with its outputs.
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
    args = parser.parse_args(argv)

    import dspy

    from modules.steps import Decomposer
    from pipeline.adapters import make_adapter
    from pipeline.config import HyperProveConfig
    from pipeline.lm import make_lm

    questions = [item["question"] for item in json.loads(Path(args.data).read_text())[: args.questions]]
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    served = make_lm(HyperProveConfig().lm)
    decomposer = Decomposer(comparisons=True)
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


if __name__ == "__main__":
    raise SystemExit(main())
