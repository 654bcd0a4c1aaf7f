"""The `index` command: build an index from a corpus, add passages to it, delete them from it.

Each holds the index's writer lock from reading the index to renaming the new generation into
place, so two commands on one index change it one after the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from modules.errors import HyperProveError
from pipeline.files import (
    writer_lock,
)
from pipeline.index import HypergraphIndex, build_index
from pipeline.index_changes import grow_index, shrink_index
from pipeline.index_store import check_index_target, load_index, save_index


def index_corpus(corpus: str | Path, out: str | Path, config, runtime=None, log: Callable[[str], None] = print,
                 make_runtime: Callable | None = None) -> dict:
    """`hyperprove index`: build the index of a corpus file under a `HyperProveConfig` and save it
    to `out`, which is checked first (an earlier index may be replaced, nothing else). With
    `cluster.ray`, LM extraction runs on Ray workers, each with `make_runtime(config)`."""
    import time

    from pipeline.corpus import load_corpus
    from pipeline.extract import describe_extraction, extractor_for
    from pipeline.runtime import Runtime

    check_index_target(out)
    passages = load_corpus(corpus)
    runtime = runtime or Runtime(config)
    say_where(config, log)
    extractor = extractor_for(config, runtime, make_runtime)
    started = time.perf_counter()
    with writer_lock(out, log):  # a second build into the same folder waits, then replaces this one whole
        index = build_index(passages, config.index, runtime.embedder, progress=True, extractor=extractor)
        save_index(index, out)
    seconds = time.perf_counter() - started
    for line in describe_extraction(extractor):
        log(line)
    log(f"index written to {out}: {index.counts()} in {seconds:.1f} s")
    return {"index": str(out), **index.counts(), "extractor": extractor.report(), "seconds": round(seconds, 2)}


def say_where(config, log: Callable[[str], None]) -> None:
    """`--ray` with an extractor that asks no LM: nothing to spread, and the user is told so."""
    from pipeline.extract import LM_EXTRACTORS

    if config.cluster.ray is not None and config.index.extractor not in LM_EXTRACTORS:
        log(f"--ray: the {config.index.extractor} extractor asks no LM, so the index is built here")


def add_to_index(added_corpus: str | Path, directory: str | Path, config, runtime=None, log: Callable[[str], None] = print,
                 make_runtime: Callable | None = None) -> dict:
    """`hyperprove index --add NEW.json --into DIR`: the passages of `added_corpus` appended to the
    index in `directory` as its next generation, written atomically over it (a kill leaves the
    previous generation, loadable and unchanged; running the command again finishes the job).
    Passages the index already holds (same title and text) are skipped, so a second run after a
    finished one adds nothing."""
    import time

    from pipeline.corpus import load_corpus
    from pipeline.extract import describe_extraction, extractor_for
    from pipeline.runtime import Runtime

    offered = load_corpus(added_corpus)
    with writer_lock(directory, log):  # one writer at a time: a second waits, then adds to this one's generation
        index = load_index(directory, expect=config.index)
        present = {(p.title, p.text) for p in index.passages}
        added = [p for p in dict.fromkeys(offered) if (p.title, p.text) not in present]  # so that running it again adds nothing twice
        if len(added) < len(offered):
            log(f"{len(offered) - len(added)} of the {len(offered)} passages are in the index already (or repeated): skipped")
        if not added:
            log(f"{directory}: nothing to add; generation {index.generation} stays")
            return {"index": str(directory), "generation": index.generation, "added": 0, **index.counts(), "seconds": 0.0}
        runtime = runtime or Runtime(config)
        say_where(config, log)
        extractor = extractor_for(config, runtime, make_runtime)
        started = time.perf_counter()
        before, base = index.counts(), index.generation
        index = grow_index(index, added, config.index, runtime.embedder, progress=True, extractor=extractor)
        save_index(index, directory, replaces=base)
    seconds = time.perf_counter() - started
    for line in describe_extraction(extractor):
        log(line)
    generation = index.generation
    log(f"{directory}: generation {generation}, {len(added)} passages added ({before['passages']} -> {len(index.passages)}): "
        f"{index.counts()} in {seconds:.1f} s")
    return {"index": str(directory), "generation": generation, "added": len(added), **index.counts(), "seconds": round(seconds, 2)}


def read_deletions(path: str | Path) -> list[int | str]:
    """A deletions file: a JSON list of passage ids (integers, as the index numbers them) and/or
    titles (strings: every passage of that title)."""
    from pipeline.corpus import check_text, read_json_list

    path = Path(path)
    items = read_json_list(path, "deletions")
    for position, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise HyperProveError(f"{path}: item {position} must be a passage id (an integer) or a title (a string), found {type(item).__name__}")
        if isinstance(item, str):
            check_text(path, position, "title", item)
    if not items:
        raise HyperProveError(f"{path}: the deletions list is empty")
    return items


def passages_to_remove(index: HypergraphIndex, wanted: Sequence[int | str], source: str, log: Callable[[str], None] = print) -> np.ndarray:
    """Positions of the passages that `wanted` names. An id or title an earlier generation removed
    is skipped with a note (so running a deletion again does nothing); one never in the index is
    an error naming it."""
    position_of = {int(i): k for k, i in enumerate(index.passage_ids)}
    titled: dict[str, list[int]] = {}
    for k, passage in enumerate(index.passages):
        titled.setdefault(passage.title, []).append(k)
    removed_in = {}
    for generation in index.info.get("generations", []):
        for passage_id, title in generation.get("removed_passages", []):
            removed_in[passage_id] = removed_in[title] = generation["generation"]
    positions: list[int] = []
    for item_number, item in enumerate(wanted):
        found = [position_of[item]] if isinstance(item, int) and item in position_of else titled.get(item, []) if isinstance(item, str) else []
        if found:
            positions += found
        elif item in removed_in:
            log(f"{source}: item {item_number} ({item!r}) was removed in generation {removed_in[item]}: skipped")
        else:
            kind = f"id {item}" if isinstance(item, int) else f"titled {item!r}"
            raise HyperProveError(f"{source}: item {item_number}: no passage {kind} in the index (passage ids are listed in its passages.jsonl)")
    return np.unique(np.array(positions, dtype=np.int64))


def delete_from_index(deletions: str | Path, directory: str | Path, config, runtime=None, log: Callable[[str], None] = print) -> dict:
    """`hyperprove index --delete IDS.json --into DIR`: the passages named in `deletions` (ids or
    titles) taken out of the index in `directory` as its next generation, written atomically over
    it (a kill leaves the previous generation; running the command again finishes the job, and
    after a finished run it finds nothing left to delete)."""
    import time

    from pipeline.runtime import Runtime

    wanted = read_deletions(deletions)
    with writer_lock(directory, log):  # one writer at a time: a second waits, then deletes from this one's generation
        index = load_index(directory, expect=config.index)
        removed = passages_to_remove(index, wanted, str(deletions), log)
        if not len(removed):
            log(f"{directory}: nothing to delete; generation {index.generation} stays")
            return {"index": str(directory), "generation": index.generation, "removed": 0, **index.counts(), "seconds": 0.0}
        if len(removed) == len(index.passages):
            raise HyperProveError(f"{deletions}: names every passage of {directory}; an index needs at least one (build a new one instead)")
        runtime = runtime or Runtime(config)
        started = time.perf_counter()
        before, base = index.counts(), index.generation
        index = shrink_index(index, removed, config.index, runtime.embedder)
        save_index(index, directory, replaces=base)
    seconds = time.perf_counter() - started
    change = index.info["generations"][-1]
    log(f"{directory}: generation {index.generation}, {len(removed)} passages removed ({before['passages']} -> {len(index.passages)}; "
        f"{change['facts_removed']} facts, {change['entities_removed']} entities, {change['renamed']} renamed): {index.counts()} in {seconds:.1f} s")
    return {"index": str(directory), "generation": index.generation, "removed": len(removed), **index.counts(), "seconds": round(seconds, 2)}
