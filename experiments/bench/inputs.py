"""Inputs that once blew up the query path and the `sentences` extractor, timed against ordinary
inputs of the same length: the work must grow with the input, not with its square or cube.

    hyperprove index ../shared/data/musique/corpus.json --out runs/musique-index
    python -m experiments.bench.inputs --index runs/musique-index

Prints, per size, the seconds of `HypergraphIndex.name_entities` on a capitalised run of that
many words against lower-case words, and of `find_entities` on a sentence of that many
name-date pairs against the same sentence in lower case.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from modules.lm.checks import find_entities
from pipeline.index.store import load_index


def seconds(work, repeat: int = 3) -> float:
    """The fastest of `repeat` runs."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True, help="an index folder (its entity names are looked up)")
    parser.add_argument("--words", default="250,500,1000,2000", help="query lengths in words")
    parser.add_argument("--pairs", default="1000,2000,4000,8000", help="name-date pairs in one sentence")
    args = parser.parse_args(argv)
    index = load_index(args.index)
    print(f"{args.index}: {len(index.entity_names)} entities, the longest name {index.longest_name} words")
    print("| words in the query | capitalised run (s) | lower case (s) |\n|---:|---:|---:|")
    for words in map(int, args.words.split(",")):
        run = " ".join(f"Name{k}" for k in range(words))
        print(f"| {words} | {seconds(lambda: index.name_entities(run)):.3f} | {seconds(lambda: index.name_entities(run.lower())):.4f} |")
    print("\n| name-date pairs in a sentence | as written (s) | lower case (s) |\n|---:|---:|---:|")
    for pairs in map(int, args.pairs.split(",")):
        sentence = " ".join(f"Name{k} 3 May {1000 + k % 900}," for k in range(pairs))
        print(f"| {pairs} | {seconds(lambda: find_entities(sentence, '')):.3f} | {seconds(lambda: find_entities(sentence.lower(), '')):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
