"""Adding and deleting passages against building from scratch: equality and cost.

    python -m experiments.bench.changes musique [--json]          # equivalence on MuSiQue (real embedder, no LM)
    python -m experiments.bench.changes musique --ivf [--json]    # the same with IVF indexes (exact_search_max 2,000)
    python -m experiments.bench.changes synthetic [--facts 1000000] [--change 10000] [--json]

`musique`: the corpus's first half is built, the second half added (`grow_index`), then 10% of
the passages (random, seed 1) deleted (`shrink_index`); after each change the index is compared
with a build of the resulting corpus from scratch: facts, entities (by name), incidence,
synonym pairs, vectors, and the ranked passages of `hyperprove` on the gold sub-questions of
MuSiQue's train and dev questions, with Recall@2/@5 (questions whose gold passages were deleted
are left out of the recall, not of the ranking comparison). With `--ivf` the fact and entity
searches are IVF, trained on the half the index was built from, so rankings may differ: the
figures are the measured difference, and how it changes when the retrain rule fires.

`synthetic`: the scale benchmark's corpus (experiments/bench/scale.py: random unit vectors,
Zipf-like entities). Three processes, as the command line would run them, on one index folder:
build (`assemble_index`: synonym search and FAISS indexes; then save), add passages holding
`--change` new facts (load, `grow_index`, save; extraction and embedding replaced by prepared
facts and random vectors), delete passages holding about as many (load, `shrink_index`, save).
Each reports the change's own time (the 5% target compares it with the build's) beside load
and save, and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

from dataclasses import asdict

from experiments.bench.synthetic import synthetic_corpus, unit_vectors
from experiments.data import load_questions
from experiments.gold import hyperprove_chain
from modules.facts import Fact, Passage
from modules.retrieval.retriever import RetrieverConfig
from pipeline.config import IndexConfig
from pipeline.index.build import assemble_index, build_index, corpus_checksum, normalise_entity
from pipeline.index.changes import grow_index, shrink_index
from pipeline.index.corpus import load_corpus
from pipeline.index.embedder import Embedder
from pipeline.index.store import load_index, save_index


# --- comparing two indexes ---------------------------------------------------------------------------
def differences(ours, theirs) -> dict:
    """What differs between two indexes of one corpus, entities compared by name (their ids may be
    numbered in another order when a deletion moved an entity's first fact)."""
    keys_ours = [normalise_entity(n) for n in ours.entity_names]
    keys_theirs = [normalise_entity(n) for n in theirs.entity_names]
    position = {key: k for k, key in enumerate(keys_theirs)}
    mapping = np.array([position.get(key, -1) for key in keys_ours], dtype=np.int64)
    same_names = set(keys_ours) == set(keys_theirs)
    incidence = ours.fact_entities.tocoo()
    mapped = {(int(r), int(c)) for r, c in zip(incidence.row, mapping[incidence.col])}
    theirs_incidence = theirs.fact_entities.tocoo()
    pairs = ours.synonyms.tocoo()
    ours_pairs = {(int(a), int(b)) for a, b in zip(mapping[pairs.row], mapping[pairs.col])}
    theirs_pairs = set(zip(theirs.synonyms.tocoo().row.tolist(), theirs.synonyms.tocoo().col.tolist()))
    entity_gap = float(np.abs(ours.entity_vectors - theirs.entity_vectors[mapping]).max()) if same_names and len(mapping) else None
    return {
        "passages_equal": ours.passages == theirs.passages,
        "facts_equal": ours.fact_text == theirs.fact_text and ours.fact_passage.tolist() == theirs.fact_passage.tolist(),
        "entity_names_equal": same_names and [ours.entity_names[k] for k in np.argsort(mapping)] == theirs.entity_names,
        "entities_numbered_alike": bool((mapping == np.arange(len(mapping))).all()),
        "incidence_differs": len(mapped ^ set(zip(theirs_incidence.row.tolist(), theirs_incidence.col.tolist()))),
        "synonym_pairs": len(theirs_pairs) // 2,
        "synonym_pairs_differ": len(ours_pairs ^ theirs_pairs) // 2,
        "fact_vector_gap": float(np.abs(ours.fact_vectors - theirs.fact_vectors).max()) if len(ours.fact_text) == len(theirs.fact_text) else None,
        "entity_vector_gap": entity_gap,
    }


def rankings(index, questions, embedder, passage_of) -> list[list]:
    """`hyperprove` on each question's gold sub-questions: ranked passages as (title, text)."""

    retriever = index.retriever(RetrieverConfig(), embedder.encode_query)
    return [[passage_of(index, k) for k in hyperprove_chain(q, retriever)[0]] for q in questions]


def recall(ranked: list[list], questions, original: list[Passage], corpus: list[Passage]) -> dict:
    """Recall@2/@5 over the questions whose gold passages (positions in `original`) are all in `corpus`."""
    present = set(corpus)
    scores = {2: [], 5: []}
    for ranking, question in zip(ranked, questions):
        gold = [original[k] for k in question.gold_passages]
        if all(g in present for g in gold):
            for k in scores:
                scores[k].append(len(set(ranking[:k]) & set(gold)) / len(gold))
    return {"questions": len(scores[2]), **{f"recall@{k}": round(100 * float(np.mean(v)), 2) for k, v in scores.items()}}


def with_vectors_of(scratch, changed, config):
    """`scratch` built again from its own facts and entities with `changed`'s vectors: the
    embedder gives a text a vector that differs in the 7th decimal with the batch it came in,
    and this separates that from what the change did."""

    position = {key: k for k, key in enumerate(changed.entity_keys)}
    vectors = {"fact": changed.fact_vectors, "passage": changed.passage_vectors,
               "entity": changed.entity_vectors[[position[key] for key in scratch.entity_keys]]}
    return assemble_index(scratch.passages, scratch.fact_text, scratch.fact_passage, scratch.fact_entities, scratch.entity_names, vectors,
                          config, scratch.info, scratch.surfaces, scratch.entity_keys, scratch.entity_order)


def compare(label: str, ours, theirs, questions, embedder, original, corpus, config) -> dict:
    passage_of = lambda index, k: index.passages[k]  # noqa: E731
    ranked_ours, ranked_theirs = rankings(ours, questions, embedder, passage_of), rankings(theirs, questions, embedder, passage_of)
    ranked_alike = rankings(with_vectors_of(theirs, ours, config), questions, embedder, passage_of)
    row = {"step": label, **differences(ours, theirs),
           "identical_rankings": sum(a == b for a, b in zip(ranked_ours, ranked_theirs)), "questions": len(questions),
           "identical_rankings_same_vectors": sum(a == b for a, b in zip(ranked_ours, ranked_alike)),
           "changed": {"recall": recall(ranked_ours, questions, original, corpus)},
           "scratch": {"recall": recall(ranked_theirs, questions, original, corpus)}}
    return row


def musique(args) -> dict:
    data = Path(args.data)
    corpus = load_corpus(data / "musique" / "corpus.json")
    questions = [q for split in ("train", "dev") for q in load_questions(data / "musique" / f"{split}.json")]
    config = IndexConfig(exact_search_max=2_000) if args.ivf else IndexConfig()
    embedder = Embedder(config.embedder, batch_size=config.batch_size, cache_dir=args.cache_dir)
    half = len(corpus) // 2
    rows = []

    started = time.perf_counter()
    grown = grow_index(build_index(corpus[:half], config, embedder, progress=False), corpus[half:], config, embedder, progress=False)
    grow_s = time.perf_counter() - started
    whole = build_index(corpus, config, embedder, progress=False)
    rows.append({**compare("add the second half", grown, whole, questions, embedder, corpus, corpus, config), "seconds": round(grow_s, 1),
                 "rebuilt": grown.info["generations"][-1].get("rebuilt", [])})

    rng = np.random.default_rng(1)
    removed = np.sort(rng.choice(len(corpus), size=len(corpus) // 10, replace=False))
    left = [p for k, p in enumerate(corpus) if k not in set(removed.tolist())]
    started = time.perf_counter()
    shrunk = shrink_index(grown, removed, config, embedder)
    shrink_s = time.perf_counter() - started
    scratch = build_index(left, config, embedder, progress=False)
    change = shrunk.info["generations"][-1]
    rows.append({**compare(f"delete {len(removed)} passages", shrunk, scratch, questions, embedder, corpus, left, config), "seconds": round(shrink_s, 1),
                 "facts_removed": change["facts_removed"], "entities_removed": change["entities_removed"], "renamed": change["renamed"],
                 "rebuilt": change.get("rebuilt", [])})
    if args.ivf:  # what the retrain rule would give if it fired now: the IVF indexes trained again on what is there
        from modules.retrieval.vectors import VectorIndex

        for name in ("fact", "entity", "passage"):
            setattr(shrunk, f"{name}_index", VectorIndex.build(getattr(shrunk, f"{name}_vectors"), exact_max=config.exact_search_max))
        rows.append({**compare("delete, indexes retrained", shrunk, scratch, questions, embedder, corpus, left, config), "seconds": None})
    return {"corpus": "musique", "passages": len(corpus), "vector_search": "ivf" if args.ivf else "exact", "steps": rows}


# --- the synthetic corpus ------------------------------------------------------------------------------
class PreparedFacts:
    """An extractor that hands back facts prepared for the passages it is given (by title)."""

    name = "synthetic"

    def __init__(self, facts: dict[str, list[tuple[str, tuple[str, ...]]]]):
        self.facts = facts

    def extract(self, passages, first_id: int = 0, progress: bool = False) -> list[list[Fact]]:
        return [[Fact(text, names, first_id + k) for text, names in self.facts[p.title]] for k, p in enumerate(passages)]

    @classmethod
    def report(cls) -> dict:
        return {"name": cls.name, "version": "1"}


class RandomVectors:
    """An embedder of random unit vectors: the text model's time is not what is measured."""

    id, dim = "random", 384

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def encode(self, texts, progress=None) -> np.ndarray:
        return unit_vectors(self.rng, len(texts))


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def timed(step: Callable[[], object]) -> tuple[object, float]:
    started = time.perf_counter()
    result = step()
    return result, round(time.perf_counter() - started, 2)


def search_ms(index, n_queries: int = 600, k: int = 10) -> float:
    """Median milliseconds of one fact search (a hop's seeding) on `index`, random unit queries."""

    queries = unit_vectors(np.random.default_rng(7), n_queries)
    times = []
    for query in queries:
        started = time.perf_counter()
        index.fact_index.search(query, k)
        times.append(time.perf_counter() - started)
    return round(1000 * float(np.median(times)), 3)


def synthetic_phase(phase: str, folder: Path, n_facts: int, n_change: int) -> dict:
    """One process per phase, as the command line runs them: build (then save), or load, add or
    delete, save. The process's peak memory is the phase's."""

    config = IndexConfig()
    rng = np.random.default_rng({"build": 2, "add": 3, "delete": 4}[phase])
    if phase == "build":
        incidence, passage_of, n_passages, fact_vectors, entity_vectors = synthetic_corpus(n_facts)
        vectors = {"fact": fact_vectors, "entity": entity_vectors, "passage": unit_vectors(rng, n_passages)}
        passages = [Passage(f"p{k}", f"p{k}") for k in range(n_passages)]
        info = {"extractor": PreparedFacts.report(), "embedder": {"id": RandomVectors.id, "dim": RandomVectors.dim}, "config": asdict(config),
                "corpus_sha256": corpus_checksum(passages), "generations": [{"generation": 0, "added": n_passages, "facts": n_facts}],
                "next_passage_id": n_passages}
        names, facts = [f"e{k}" for k in range(incidence.shape[1])], [f"f{k}" for k in range(n_facts)]
        index, seconds = timed(lambda: assemble_index(passages, facts, passage_of, incidence, names, vectors, config, info))
        _, save_s = timed(lambda: save_index(index, folder))
        return {"seconds": seconds, "save_s": save_s, "peak_rss_mb": peak_rss_mb(), "facts": len(index.fact_text),
                "fact_search": index.fact_index.kind, "entity_search": index.entity_index.kind, "search_ms": search_ms(index)}
    index, load_s = timed(lambda: load_index(folder))
    search_before = search_ms(index)  # the same process and machine load as the figure after the change
    if phase == "add":  # passages of 1-7 facts, over the old entities (the same skew) and 20% new names
        per_passage = rng.integers(1, 8, size=n_change)
        per_passage = per_passage[: np.searchsorted(np.cumsum(per_passage), n_change) + 1]
        weights = 1.0 / (np.arange(len(index.entity_names)) + 20.0)
        prepared, number = {}, 0
        for k, size in enumerate(per_passage):
            rows = []
            for _ in range(size):
                old = rng.choice(len(index.entity_names), size=int(rng.integers(1, 5)), p=weights / weights.sum())
                rows.append((f"g{number}", tuple(f"e{e}" if rng.random() > 0.2 else f"n{number}-{j}" for j, e in enumerate(old))))
                number += 1
            prepared[f"added{k}"] = rows
        added = [Passage(title, title) for title in prepared]
        index, seconds = timed(lambda: grow_index(index, added, config, RandomVectors(5), progress=False, extractor=PreparedFacts(prepared)))
        row = {"facts": number, "passages": len(added)}
    else:  # passages holding about n_change facts, spread over the corpus
        sizes = np.bincount(index.fact_passage, minlength=len(index.passages))
        order = rng.permutation(len(index.passages))
        removed = np.sort(order[: np.searchsorted(np.cumsum(sizes[order]), n_change) + 1])
        index, seconds = timed(lambda: shrink_index(index, removed, config, RandomVectors(6)))
        change = index.info["generations"][-1]
        row = {"facts": change["facts_removed"], "passages": len(removed), "entities_removed": change["entities_removed"]}
    _, save_s = timed(lambda: save_index(index, folder))
    return {**row, "seconds": seconds, "load_s": load_s, "save_s": save_s, "peak_rss_mb": peak_rss_mb(),
            "facts_after": len(index.fact_text), "rebuilt": index.info["generations"][-1].get("rebuilt", []),
            "search_ms_before": search_before, "search_ms": search_ms(index)}


def synthetic(args) -> dict:
    """The three phases in turn, each in a fresh process, on one index folder."""
    with tempfile.TemporaryDirectory(dir=args.tmp) as scratch:
        folder = Path(scratch) / "index"
        phases = {}
        for phase in ("build", "add", "delete"):
            command = [sys.executable, "-m", __spec__.name, "synthetic", "--phase", phase, "--folder", str(folder),
                       "--facts", str(args.facts), "--change", str(args.change)]
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                raise RuntimeError(f"{phase} failed: {done.stderr.strip().splitlines()[-3:]}")
            phases[phase] = json.loads(done.stdout.strip().splitlines()[-1])
    build = phases["build"]["seconds"]
    return {"corpus": "synthetic", **phases,
            "add_share": round(phases["add"]["seconds"] / build, 4), "delete_share": round(phases["delete"]["seconds"] / build, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("corpus", choices=["musique", "synthetic"])
    parser.add_argument("--ivf", action="store_true", help="musique: IVF fact and entity search (exact_search_max 2,000)")
    parser.add_argument("--facts", type=int, default=1_000_000, help="synthetic: facts in the index")
    parser.add_argument("--change", type=int, default=10_000, help="synthetic: facts added, then about as many deleted")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--cache-dir", default=str(ROOT / ".hyperprove" / "cache"), help="embedding cache")
    parser.add_argument("--tmp", default=None, help="synthetic: where the index is saved and loaded")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    parser.add_argument("--phase", choices=["build", "add", "delete"], help=argparse.SUPPRESS)  # internal: one synthetic phase
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        print(json.dumps(synthetic_phase(args.phase, Path(args.folder), args.facts, args.change)))
        return 0
    result = musique(args) if args.corpus == "musique" else synthetic(args)
    if args.corpus == "musique":
        for row in result["steps"]:
            print(f"{row['step']}: {row['identical_rankings']}/{row['questions']} identical rankings "
                  f"({row['identical_rankings_same_vectors']} with the same vectors); synonym pairs differ "
                  f"{row['synonym_pairs_differ']}/{row['synonym_pairs']}; incidence differs {row['incidence_differs']}; "
                  f"names equal {row['entity_names_equal']} (numbered alike {row['entities_numbered_alike']}); "
                  f"R@2/R@5 changed {row['changed']['recall']['recall@2']}/{row['changed']['recall']['recall@5']} "
                  f"vs scratch {row['scratch']['recall']['recall@2']}/{row['scratch']['recall']['recall@5']} "
                  f"({row['changed']['recall']['questions']} q)", flush=True)
    else:
        build, add, delete = result["build"], result["add"], result["delete"]
        print(f"{build['facts']:,} facts ({build['fact_search']} facts, {build['entity_search']} entities): "
              f"build {build['seconds']} s, peak {build['peak_rss_mb']:,} MB (save {build['save_s']} s; a fact search {build['search_ms']} ms)\n"
              f"  add {add['facts']:,} facts: {add['seconds']} s = {100 * result['add_share']:.1f}% of the build, peak {add['peak_rss_mb']:,} MB "
              f"(load {add['load_s']} s, save {add['save_s']} s; a fact search {add['search_ms_before']} -> {add['search_ms']} ms)\n"
              f"  delete {delete['facts']:,} facts: {delete['seconds']} s = {100 * result['delete_share']:.1f}% of the build, "
              f"peak {delete['peak_rss_mb']:,} MB (load {delete['load_s']} s, save {delete['save_s']} s; "
              f"a fact search {delete['search_ms_before']} -> {delete['search_ms']} ms)", flush=True)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
