"""Cut a benchmark down to its first N questions and the passages that come with them.

The benchmark corpora list each question's paragraphs together, in question order. The slice
keeps the span of the corpus from the first gold passage of the first question to the last gold
passage of the last one, plus any gold passage outside that span (one shared with an earlier
question), and renumbers the questions' passage ids into the slice. It makes an LM-extracted index
of a few hundred passages possible where the whole corpus would take a day on a laptop CPU.

    python -m experiments.tools.slice --questions ../shared/data/musique/dev.json \\
        --corpus ../shared/data/musique/corpus.json --first 20 --out experiments/slices/musique-dev-20
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from modules.errors import HyperProveError
from pipeline.files import atomic_write_json, read_json


def slice_benchmark(questions: list[dict], corpus: list[dict], first: int) -> tuple[list[dict], list[dict], list[int]]:
    """The first `first` questions, their passages, and the kept corpus ids (in corpus order)."""
    chosen = questions[:first]
    if not chosen:
        raise HyperProveError("slice: no questions to keep")
    start = min(chosen[0]["gold_passages"])
    stop = max(chosen[-1]["gold_passages"])
    gold = {p for q in chosen for p in q["gold_passages"]}
    kept = sorted(set(range(start, stop + 1)) | gold)
    if kept[-1] >= len(corpus):
        raise HyperProveError(f"slice: passage {kept[-1]} is outside the corpus of {len(corpus)}")
    new_id = {old: new for new, old in enumerate(kept)}
    sliced = []
    for question in chosen:
        question = json.loads(json.dumps(question))
        question["gold_passages"] = [new_id[p] for p in question["gold_passages"]]
        for step in question.get("decomposition") or []:
            if step.get("passage") is not None:
                step["passage"] = new_id.get(step["passage"])
        sliced.append(question)
    return sliced, [corpus[k] for k in kept], kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--out", required=True, help="directory for questions.json, corpus.json, slice.json")
    args = parser.parse_args()
    questions, corpus, kept = slice_benchmark(read_json(args.questions, "questions"), read_json(args.corpus, "corpus"), args.first)
    out = Path(args.out)
    atomic_write_json(out / "questions.json", questions)
    atomic_write_json(out / "corpus.json", corpus)
    atomic_write_json(out / "slice.json", {"questions": args.questions, "corpus": args.corpus, "first": args.first, "corpus_ids": kept})
    print(f"{len(questions)} questions, {len(corpus)} passages written to {out}")


if __name__ == "__main__":
    main()
