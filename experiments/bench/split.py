"""Does reading a folder lose retrieval? A benchmark corpus as its original passages against the same
text written out as documents and read back by `pipeline.index.documents` (split into passages).

    python -m experiments.bench.split                       # MuSiQue dev, both layouts
    python -m experiments.bench.split --dataset musique --split dev --layouts articles plain

Layouts: `articles` writes one Markdown file per title (`# Title`, then each passage of that title
as a paragraph), as a wiki would; `plain` writes `--per-file` consecutive passages as the
paragraphs of one text file with no titles at all, the hardest case. The folder is read with the
default split (`index.passage_words`, `index.passage_overlap`) and indexed with the default
config; each question's gold sub-questions are run hop by hop (the gold protocol), and its
ranked split passages are read as original passages (a split passage stands for every original
it holds whole, or the one it is a piece of), in order of first appearance, so that Recall@5
counts original passages on both sides. Prints Recall@2/5 per layout, and the paired bootstrap
95% interval of each against the original passages.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from experiments.data import load_questions
from experiments.metrics import mean_percent, recall_at_k
from experiments.stats import describe_difference, paired_difference
from pipeline.index.corpus import load_corpus
from pipeline.index.documents import Reading, markdown_line, read_folder
from pipeline.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]


def normalised(text: str) -> str:
    return " ".join(text.split())


def write_articles(passages, folder: Path) -> None:
    by_title: dict[str, list[str]] = {}
    for passage in passages:
        by_title.setdefault(passage.title, []).append(normalised(passage.text))
    for number, (title, texts) in enumerate(by_title.items()):
        (folder / f"{number:05d}.md").write_text(f"# {title}\n\n" + "\n\n".join(texts) + "\n")


def write_plain(passages, folder: Path, per_file: int) -> None:
    for start in range(0, len(passages), per_file):
        texts = [normalised(p.text) for p in passages[start:start + per_file]]
        (folder / f"{start // per_file:05d}.txt").write_text("\n\n".join(texts) + "\n")


def originals_of(split_passages, passages, layout: str) -> list[list[int]]:
    """Per split passage, the original passages it holds whole, or the one it is a piece of (an
    original as the reader gives it back: Markdown's marks, such as MuSiQue's `` quotes, go)."""

    read = markdown_line if layout == "articles" else str
    position: dict[str, list[int]] = {}
    for k, passage in enumerate(passages):
        position.setdefault(normalised(read(normalised(passage.text))), []).append(k)
    texts = list(position)
    found = []
    for split in split_passages:
        text = split.text
        held = [k for t in texts if t in text for k in position[t]]
        if not held:
            held = [k for t in texts if text in t for k in position[t]][:1]
        found.append(held)
    return found


def as_originals(ranked: list[int], originals: list[list[int]]) -> list[int]:
    return list(dict.fromkeys(k for split in ranked for k in originals[split]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="musique", help="a dataset folder of ../shared/data with gold decompositions")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--layouts", nargs="+", default=["articles", "plain"], choices=["articles", "plain"])
    parser.add_argument("--per-file", type=int, default=10, help="plain layout: passages a file")
    parser.add_argument("--cache-dir", default=".hyperprove/cache")
    args = parser.parse_args(argv)

    from experiments.gold import hyperprove_chain
    from pipeline.config import HyperProveConfig
    from pipeline.index.store import cached_index

    data = ROOT.parent / "shared" / "data" / args.dataset
    passages = load_corpus(data / "corpus.json")
    questions = [q for q in load_questions(data / f"{args.split}.json", passages) if q.decomposition and q.gold_passages]
    config = HyperProveConfig().with_overrides(cache_dir=args.cache_dir)
    runtime = Runtime(config)

    def recall_rows(corpus, originals=None) -> list[dict]:
        index, _ = cached_index(corpus, config, runtime, log=lambda line: None)
        retriever = index.retriever(config.retriever, runtime.embedder.encode_query)
        rows = []
        for question in questions:
            ranked, _ = hyperprove_chain(question, retriever)
            ranked = as_originals(ranked, originals) if originals else ranked
            rows.append({f"recall@{k}": recall_at_k(ranked, question.gold_passages, k) for k in (2, 5)})
        return rows

    print(f"{args.dataset} {args.split}: {len(questions)} questions with gold steps; {len(passages)} passages "
          f"(median {sorted(len(p.text.split()) for p in passages)[len(passages) // 2]} words); split at "
          f"{config.index.passage_words} words, {config.index.passage_overlap} of overlap", flush=True)
    original = recall_rows(passages)
    print("| corpus | files | passages | Recall@2 | Recall@5 | Recall@5 against the original passages |")
    print("|---|---:|---:|---:|---:|---|")
    print(f"| original passages | 1 | {len(passages)} | {mean_percent(original, 'recall@2'):.2f} | {mean_percent(original, 'recall@5'):.2f} | |", flush=True)
    for layout in args.layouts:
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            write_articles(passages, folder) if layout == "articles" else write_plain(passages, folder, args.per_file)
            started = time.perf_counter()
            read = read_folder(folder, Reading.of(config.index), log=lambda line: None)
            seconds = time.perf_counter() - started
        originals = originals_of(read.passages, passages, layout)
        unmapped = sum(not held for held in originals)
        rows = recall_rows(read.passages, originals)
        difference = describe_difference(paired_difference(rows, original, "recall@5"))
        print(f"| {layout} ({re.sub(' +', ' ', describe(layout, args.per_file))}) | {len(read.files)} | {len(read.passages)} | "
              f"{mean_percent(rows, 'recall@2'):.2f} | {mean_percent(rows, 'recall@5'):.2f} | {difference} |", flush=True)
        print(f"  read in {seconds:.1f} s; split passages that are no original's text: {unmapped}", file=sys.stderr)
    return 0


def describe(layout: str, per_file: int) -> str:
    return "a Markdown file per title" if layout == "articles" else f"{per_file} passages a text file, no titles"


if __name__ == "__main__":
    sys.exit(main())
