"""Adding passages to an index and deleting them, as a build of the resulting corpus would give it.

Only new passages are extracted and embedded; a deletion embeds only the names of entities whose
naming fact left. Synonym pairs are searched again only where names came or went (step 2), and
the FAISS indexes change in place up to a retrain rule. Arrays change size in place, so a million
vectors are never held twice.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from modules.errors import HyperProveError
from modules.facts import Passage
from modules.retrieval.hypergraph import binary_csr
from modules.retrieval.vectors import VectorIndex
from pipeline.config import IndexConfig
from pipeline.index.build import (
    SYNONYM_NPROBE,
    VECTOR_SETS,
    HypergraphIndex,
    corpus_checksum,
    embed_new,
    entity_incidence,
    listed_incidence,
    vector_index,
)
from pipeline.index.extract import Extractor, make_extractor


def widened(matrix: sp.csr_matrix, shape: tuple[int, int]) -> sp.csr_matrix:
    """`matrix` with empty rows and columns appended up to `shape` (no copy of its entries)."""
    extra_rows = shape[0] - matrix.shape[0]
    indptr = np.concatenate([matrix.indptr, np.full(extra_rows, matrix.indptr[-1], dtype=matrix.indptr.dtype)])
    return sp.csr_matrix((matrix.data, matrix.indices, indptr), shape=shape)


def settle_vector_indexes(indexes: dict[str, VectorIndex], vectors: dict[str, np.ndarray], info: dict, config: IndexConfig) -> list[str]:
    """The retrain rule for indexes changed in place: an index is built again, as a fresh build
    would build it, when its size has crossed `exact_search_max` (exact <-> IVF) or
    `compressed_search_min` (IVF <-> IVF-PQ) or, for IVF and IVF-PQ, when it holds more than twice or less than half the vectors its lists were trained on (the
    lists then no longer fit the data: twice the vectors per list at the same nprobe, or
    centroids of a distribution that has moved). Updates `indexes` and info["built_on"]; returns
    the names built again."""
    built_on = dict(info.get("built_on") or {name: len(indexes[name]) for name in VECTOR_SETS})
    rebuilt = []
    for name in VECTOR_SETS:
        size, trained = len(vectors[name]), built_on.get(name, len(vectors[name]))
        wanted = VectorIndex.kind_for(size, config.exact_search_max, config.compressed_search_min)
        if indexes[name].kind != wanted or (wanted != "exact" and not trained / 2 <= size <= 2 * trained):
            indexes[name] = vector_index(vectors[name], config)
            built_on[name] = size
            rebuilt.append(name)
    info["built_on"] = built_on
    return rebuilt


def grow_index(index: HypergraphIndex, added: list[Passage], config: IndexConfig, embedder, progress: bool = True,
               extractor: Extractor | None = None) -> HypergraphIndex:
    """The index with `added` appended as passages len(index.passages)...: only they are extracted
    and embedded, and only the new names (and the old names they find above eta) are searched
    for synonyms, against every name. Facts, entities and passages keep their ids; the FAISS
    indexes grow in place (an IVF index keeps the lists it was trained with, up to the retrain
    rule of `settle_vector_indexes`). On the same data a build of the whole corpus gives the same
    ids, vectors and incidence; see `grow_synonyms`. `index` is consumed: its FAISS indexes are
    the new one's."""
    extractor = extractor or make_extractor(config.extractor, rules=index.info["config"].get("sentence_rules", 1))  # the rules it was built with
    if extractor.name != index.info["extractor"]["name"]:
        raise HyperProveError(f"the index was built with the {index.info['extractor']['name']!r} extractor; grow it with the same, not {extractor.name!r}")
    passages = index.passages + list(added)
    facts = [fact for per_passage in extractor.extract(added, first_id=len(index.passages), progress=progress) for fact in per_passage]
    names = list(index.entity_names)
    key_to_id = dict(index.entity_ids)  # a copy: the new names join it
    incidence, order, surfaces = entity_incidence(facts, key_to_id, names, first_row=len(index.fact_text))
    fact_entities = sp.vstack([widened(index.fact_entities, (index.fact_entities.shape[0], len(names))), incidence]).tocsr()
    fresh = embed_new(facts, names[len(index.entity_names):], added, passages, embedder, progress)
    vectors = {name: appended_rows(taken(index, f"{name}_vectors"), fresh[name]) for name in VECTOR_SETS}
    indexes = {name: getattr(index, f"{name}_index") for name in VECTOR_SETS}
    for name in VECTOR_SETS:
        indexes[name].add(fresh[name])
    info = dict(index.info)
    rebuilt = settle_vector_indexes(indexes, vectors, info, config)
    synonyms = grow_synonyms(index.synonyms, vectors["entity"], indexes["entity"], len(index.entity_names), config.eta, config.synonym_neighbors)
    first_id = index.next_passage_id
    checksum = corpus_checksum(passages)
    info.update(corpus_sha256=checksum, next_passage_id=first_id + len(added), generations=[*index.info["generations"], {
        "generation": index.generation + 1, "added": len(added), "facts": len(facts), "first_passage_id": first_id,
        "extractor": extractor.report(), "corpus_sha256": checksum, **({"rebuilt": rebuilt} if rebuilt else {})}])
    return HypergraphIndex.from_parts(passages, index.fact_text + [f.text for f in facts],
                                      np.concatenate([index.fact_passage, np.array([f.passage for f in facts], dtype=np.int64)]),
                                      fact_entities, names, synonyms, vectors, indexes, info,
                                      passage_ids=np.concatenate([index.passage_ids, first_id + np.arange(len(added))]),
                                      surfaces={**index.surfaces, **surfaces}, entity_keys=list(key_to_id),
                                      entity_order=np.concatenate([index.entity_order, order]))


def shrink_index(index: HypergraphIndex, removed: np.ndarray, config: IndexConfig, embedder) -> HypergraphIndex:
    """The index without the passages at positions `removed`, as a build of the passages left
    would give it: their facts leave every structure; an entity no fact names any more leaves
    with its synonym pairs; an entity whose name came from a removed fact takes the name its
    first remaining fact used (re-embedded: the only embedding done here). Entities are numbered
    again by their first remaining fact, as a build numbers them, so that even the order of
    floating-point sums is a build's. The synonym lists that can change are searched again
    (`shrink_synonyms`), the FAISS indexes shrink in place. Facts and passages keep their order
    (ids close up); passages keep their stable ids. `index` is consumed."""
    gone = np.zeros(len(index.passages), dtype=bool)
    gone[np.asarray(removed, dtype=np.int64)] = True
    fact_out = gone[index.fact_passage]
    kept_facts, fact_gone = np.flatnonzero(~fact_out), np.flatnonzero(fact_out)
    entries = index.fact_entities
    listed = sp.csr_matrix((index.entity_order + 1.0, entries.indices, entries.indptr), shape=entries.shape)[kept_facts]
    first_now, place = _first_rows(listed)
    survivors = np.flatnonzero(first_now >= 0)
    order = survivors[np.lexsort((place[survivors], first_now[survivors]))]  # old ids, as a build would number them
    entity_map = np.full(entries.shape[1], -1, dtype=np.int64)
    entity_map[order] = np.arange(len(order))
    renamed_names = _renamed(index, kept_facts, first_now)
    renamed = np.array(sorted(renamed_names), dtype=np.int64)
    fact_map = np.cumsum(~fact_out) - 1
    surfaces = {(int(fact_map[row]), int(entity_map[entity])): name
                for (row, entity), name in _rebased_surfaces(index, renamed_names).items() if not fact_out[row]}
    new_vectors = embedder.encode([renamed_names[e] for e in renamed]) if len(renamed) else np.zeros((0, index.entity_vectors.shape[1]), np.float32)
    vectors = {"fact": kept_rows(taken(index, "fact_vectors"), kept_facts), "passage": kept_rows(taken(index, "passage_vectors"), np.flatnonzero(~gone)),
               "entity": kept_rows(taken(index, "entity_vectors"), order)}
    vectors["entity"][entity_map[renamed]] = new_vectors
    indexes = {name: getattr(index, f"{name}_index") for name in VECTOR_SETS}
    indexes["fact"].remove(fact_gone)
    indexes["passage"].remove(np.flatnonzero(gone))
    indexes["entity"].renumber(entity_map)
    indexes["entity"].replace(entity_map[renamed], new_vectors)
    info = dict(index.info)
    rebuilt = settle_vector_indexes(indexes, vectors, info, config)
    synonyms = shrink_synonyms(index.synonyms, entity_map, renamed, vectors["entity"], indexes["entity"], config.eta, config.synonym_neighbors)
    fact_entities, entity_order = listed_incidence(np.repeat(np.arange(len(kept_facts)), np.diff(listed.indptr)), entity_map[listed.indices],
                                                   listed.data.astype(np.int64) - 1, (len(kept_facts), len(order)))
    passages = [p for p, out in zip(index.passages, gone) if not out]
    checksum = corpus_checksum(passages)
    info.update(corpus_sha256=checksum, generations=[*index.info["generations"], {
        "generation": index.generation + 1, "removed": int(gone.sum()), "facts_removed": len(fact_gone),
        "entities_removed": entries.shape[1] - len(order), "renamed": len(renamed),
        "removed_passages": [[int(i), p.title] for i, p, out in zip(index.passage_ids, index.passages, gone) if out],
        "corpus_sha256": checksum, **({"rebuilt": rebuilt} if rebuilt else {})}])
    names = [renamed_names.get(e, index.entity_names[e]) for e in order.tolist()]
    return HypergraphIndex.from_parts(
        passages, [index.fact_text[k] for k in kept_facts], np.cumsum(~gone)[index.fact_passage[kept_facts]] - 1, fact_entities,
        names, synonyms, vectors, indexes, info, passage_ids=index.passage_ids[~gone], surfaces=surfaces,
        entity_keys=[index.entity_keys[e] for e in order.tolist()], entity_order=entity_order)


def _first_rows(incidence: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Per entity (column), the first fact (row) naming it (-1 for none), and the matrix's value there."""
    csc = incidence.tocsc()
    csc.sort_indices()
    if not csc.nnz:
        return np.full(incidence.shape[1], -1, dtype=np.int64), np.zeros(incidence.shape[1])
    first = np.minimum(csc.indptr[:-1], csc.nnz - 1)
    named = np.diff(csc.indptr) > 0
    return np.where(named, csc.indices[first], -1).astype(np.int64), np.where(named, csc.data[first], 0.0)


def _renamed(index: HypergraphIndex, kept_facts: np.ndarray, first_now: np.ndarray) -> dict[int, str]:
    """Entities whose first fact leaves and whose first remaining fact (`first_now`, among
    `kept_facts`) calls them otherwise: their new name, by old id."""
    first_before, _ = _first_rows(index.fact_entities)
    moved = np.flatnonzero((first_now >= 0) & (kept_facts[np.maximum(first_now, 0)] != first_before))
    renamed = {}
    for entity in moved.tolist():
        name = index.surfaces.get((int(kept_facts[first_now[entity]]), entity), index.entity_names[entity])
        if name != index.entity_names[entity]:
            renamed[entity] = name
    return renamed


def _rebased_surfaces(index: HypergraphIndex, renamed: dict[int, str]) -> dict[tuple[int, int], str]:
    """The surface names facts used, relative to the new names of renamed entities (old ids)."""
    surfaces = dict(index.surfaces)
    if renamed:
        columns = index.fact_entities.tocsc()
        for entity, name in renamed.items():
            for row in columns.indices[columns.indptr[entity] : columns.indptr[entity + 1]].tolist():
                used = index.surfaces.get((row, entity), index.entity_names[entity])
                if used == name:
                    surfaces.pop((row, entity), None)
                else:
                    surfaces[(row, entity)] = used
    return surfaces


ROW_CHUNK = 65_536


def taken(index: HypergraphIndex, name: str) -> np.ndarray:
    """index.<name>, taken out of the index being changed (it is consumed), so that the array can
    change size in place without another owner seeing it; a memory-mapped one is read in."""
    array = getattr(index, name)
    setattr(index, name, None)
    return array if array.flags.writeable else np.array(array)  # memory-mapped (read only): into memory


def resized(array: np.ndarray, rows: int) -> np.ndarray:
    """`array` with `rows` rows: in place (a realloc, which the OS serves by remapping pages, not
    by a second copy of a million vectors) where numpy owns the buffer and nothing else views it;
    a copy otherwise."""
    try:
        array.resize((rows, *array.shape[1:]), refcheck=False)
        return array
    except ValueError:  # a view, or memory numpy did not allocate
        out = np.zeros((rows, *array.shape[1:]), dtype=array.dtype)
        out[: min(rows, len(array))] = array[:rows]
        return out


def appended_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    first = len(array)
    array = resized(np.asarray(array, dtype=np.float32), first + len(rows))
    array[first:] = rows
    return array


def kept_rows(array: np.ndarray, order: np.ndarray) -> np.ndarray:
    """array[order] in place, cut to len(order) rows, for rows that mostly keep their order and
    move to lower places: the kept rows of a deletion (ascending) or entities numbered again
    (a few move later). Rows bound for a higher place are set aside first; the others move in
    ascending order of place, so each is read before its place is written, and a run of
    consecutive rows moves as one slice (ROW_CHUNK rows at a time). No second copy of the array."""
    order = np.asarray(order, dtype=np.int64)
    shift = order - np.arange(len(order))
    later = np.flatnonzero(shift < 0)
    aside = array[order[later]]
    breaks = np.flatnonzero(np.diff(order) != 1) + 1
    for start, end in zip(np.concatenate([[0], breaks]).tolist(), np.concatenate([breaks, [len(order)]]).tolist()):
        if start == end or shift[start] <= 0:
            continue  # in place already, or set aside
        for offset in range(start, end, ROW_CHUNK):
            stop = min(offset + ROW_CHUNK, end)
            array[offset:stop] = array[offset + shift[start] : stop + shift[start]]
    array[later] = aside
    return resized(array, len(order))


def names_near(entity_index: VectorIndex, vectors: np.ndarray, eta: float) -> np.ndarray:
    """The names above eta from any of `vectors`: the only names whose synonym lists a name with
    one of these vectors can enter or leave."""
    return np.unique(entity_index.within(vectors, eta, nprobe=SYNONYM_NPROBE)[1]) if len(vectors) else np.zeros(0, dtype=np.int64)


def first_per_row(rows: np.ndarray, scores: np.ndarray, count: int) -> np.ndarray:
    """Positions of the `count` highest scores of each row (rows sorted): a nearest-neighbour
    list read off a range search, which holds every neighbour above the threshold."""
    order = np.lexsort((-scores, rows))
    starts = np.searchsorted(rows[order], rows[order], side="left")
    return order[np.arange(len(order)) - starts < count]


def shrink_synonyms(synonyms: sp.csr_matrix, new_ids: np.ndarray, renamed: np.ndarray, entity_vectors: np.ndarray,
                    entity_index: VectorIndex, eta: float, neighbors: int) -> sp.csr_matrix:
    """Step 2 after names left (`new_ids` -1; the others renumbered to new_ids) or changed their
    vectors (`renamed`, old ids), giving the pairs a full search of the names left gives. A name
    whose list held a leaving or changed name is paired with it, so the lists that can change are
    those of their partners, of the changed names, and of the names near their new vectors (no
    search over the names that leave); `refresh_synonyms` searches them again. `entity_vectors`
    and `entity_index` are those after the change, in the new numbering."""
    synonyms = synonyms.tocsr()
    partners = synonyms[np.concatenate([np.flatnonzero(new_ids < 0), renamed])].indices
    touched = np.concatenate([new_ids[partners][new_ids[partners] >= 0], new_ids[renamed],
                              names_near(entity_index, entity_vectors[new_ids[renamed]], eta)])
    pairs = synonyms.tocoo()
    rows, cols = new_ids[pairs.row], new_ids[pairs.col]
    both = (rows >= 0) & (cols >= 0)
    n = len(entity_vectors)
    return refresh_synonyms(binary_csr(rows[both], cols[both], (n, n)), entity_vectors, entity_index, touched, eta, neighbors)


def grow_synonyms(synonyms: sp.csr_matrix, entity_vectors: np.ndarray, entity_index: VectorIndex, first_new: int, eta: float,
                  neighbors: int) -> sp.csr_matrix:
    """Step 2 for new names, giving the pairs a build of the whole corpus gives. New names can
    change an old name's list only if one of them lies above eta from it (then it may enter the
    list and push a pair out): those old names and the new ones are the names `refresh_synonyms`
    searches again. One range search around the new names finds those old names and gives the
    new names' own lists (their nearest above eta), so only the old names are searched again."""
    n = len(entity_vectors)
    if first_new == n:
        return synonyms
    new = np.arange(first_new, n)
    rows, found, scores = entity_index.within(entity_vectors[new], eta, nprobe=SYNONYM_NPROBE)
    listed = first_per_row(rows, scores, neighbors + 1)  # as the search for a new name's neighbors + 1 nearest finds them
    return refresh_synonyms(synonyms, entity_vectors, entity_index, np.union1d(found, new), eta, neighbors,
                            searched=(new, new[rows[listed]], found[listed]))


def refresh_synonyms(synonyms: sp.csr_matrix, entity_vectors: np.ndarray, entity_index: VectorIndex, touched: np.ndarray, eta: float,
                     neighbors: int, searched: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> sp.csr_matrix:
    """Step 2 again where the names changed, giving the pairs a full search gives. A pair is two
    names one of which is among the other's `neighbors` nearest above eta. `touched` are the
    names whose lists may have changed (a name near them came or went); every other list is as
    it was, so a pair between two untouched names stays. The touched names and their old
    partners (whose lists may hold them) have their lists searched again, and their pairs come
    from those lists. `synonyms` is in the current numbering, with rows for every name.
    `searched` = (names, rows, cols): names whose lists are already known, as (row, col) pairs."""
    n = len(entity_vectors)
    old = widened(synonyms.tocsr(), (n, n))  # names appended since have empty rows and columns
    touched = np.unique(np.asarray(touched, dtype=np.int64))
    if not len(touched):
        return old
    known, known_rows, known_cols = searched or (np.zeros(0, dtype=np.int64),) * 3
    redone = np.setdiff1d(np.union1d(touched, old[touched].indices), known)
    scores, found = entity_index.search(entity_vectors[redone], neighbors + 1, nprobe=SYNONYM_NPROBE)
    keep = (scores > eta) & (found >= 0) & (found != redone[:, None])
    other = known_rows != known_cols
    rows = np.concatenate([np.broadcast_to(redone[:, None], found.shape)[keep], known_rows[other]])
    cols = np.concatenate([found[keep], known_cols[other]])
    kept = old.tocoo()
    stays = ~np.isin(kept.row, touched) & ~np.isin(kept.col, touched)
    all_rows = np.concatenate([kept.row[stays], rows, cols])
    all_cols = np.concatenate([kept.col[stays], cols, rows])
    return binary_csr(all_rows.astype(np.int64), all_cols.astype(np.int64), (n, n))
