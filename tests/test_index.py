"""Entity normalisation, synonyms, the index build and its on-disk format."""

import json
import shutil

import numpy as np
import pytest
from conftest import dense

from modules.errors import HyperProveError
from modules.facts import Passage
from modules.retrieval.retriever import RetrieverConfig
from pipeline.config import IndexConfig
from pipeline.index import store as index_store
from pipeline.index.build import build_index, normalise_entity, synonym_matrix
from pipeline.index.store import load_index, save_index

CORPUS = [
    Passage("Jaws (film)", "Jaws is a 1975 film directed by Steven Spielberg. It was a box-office hit."),
    Passage("Steven Spielberg", "Steven Spielberg is a director born in Cincinnati. His mother was Leah Adler."),
    Passage("Leah Adler", "Leah Adler was a restaurateur. She died in 2017 in Los Angeles."),
]


def test_normalise_entity():
    assert normalise_entity("The Beatles") == normalise_entity("the  beatles") == "beatles"
    assert normalise_entity("Pope John's") == "pope john"
    assert normalise_entity("Zoë Saldaña") == "zoe saldana"
    assert normalise_entity("Thrace-Macedonia") == "thrace macedonia"


def test_synonyms_by_threshold_not_all_pairs():
    # cos(0, 1) = 0.9 > eta; cos(0, 2) = 0.6 and cos(1, 2) ~ 0.69 are below eta = 0.8.
    v0 = np.array([1.0, 0.0, 0.0])
    v1 = np.array([0.9, np.sqrt(1 - 0.81), 0.0])
    v2 = np.array([0.6, 0.0, 0.8])
    matrix, entity_index = synonym_matrix(np.stack([v0, v1, v2]).astype(np.float32), eta=0.8, neighbors=2, exact_max=10)
    assert dense(matrix).tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 0]]
    assert len(entity_index) == 3
    matrix, _ = synonym_matrix(np.stack([v0, v1, v2]).astype(np.float32), eta=0.5, neighbors=2, exact_max=10)
    assert dense(matrix).sum() == 6  # every pair, both directions, no self-pairs


def test_synonyms_through_the_approximate_index():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(3000, 16)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    twins = base[:50] + 0.05 * rng.normal(size=(50, 16)).astype(np.float32)
    twins /= np.linalg.norm(twins, axis=1, keepdims=True)
    matrix, entity_index = synonym_matrix(np.concatenate([base, twins]), eta=0.95, neighbors=5, exact_max=1000)
    assert entity_index.kind == "ivf"
    found = {(i, j) for i, j in zip(*matrix.nonzero()) if i < j}
    assert {(k, 3000 + k) for k in range(50)} <= found


@pytest.fixture
def built(hash_embedder):
    return build_index(CORPUS, IndexConfig(eta=0.99), hash_embedder, progress=False)


def test_build_links_facts_through_shared_entities(built):
    names = [normalise_entity(n) for n in built.entity_names]
    spielberg = names.index("steven spielberg")
    holders = sorted(built.fact_passage[built.fact_entities[:, spielberg].nonzero()[0]].tolist())
    assert holders == [0, 1, 1]  # the Jaws fact and both Spielberg sentences ("His mother" resolved)
    assert built.counts() == {"passages": 3, "facts": 6, "entities": len(names), "synonym_pairs": 0, "incidences": built.fact_entities.nnz}
    assert "Steven Spielberg's mother was Leah Adler." in built.fact_text


def test_a_query_names_the_index_entities_it_mentions(built):
    # by the extractor's rules and normalised names: "the Steven Spielberg" is the entity
    # "Steven Spielberg", "Leah Adler's" is "Leah Adler"; "Paris" is no entity of this corpus
    ids = {name: k for k, name in enumerate(built.entity_names)}
    named = built.name_entities("Was the Steven Spielberg of Jaws born before Leah Adler's death in Paris?")
    assert sorted(named) == sorted([ids["Steven Spielberg"], ids["Jaws"], ids["Leah Adler"]])
    assert built.name_entities("who directed it?") == []
    retriever = built.retriever(RetrieverConfig(), lambda text: np.ones(built.fact_vectors.shape[1], dtype=np.float32))
    assert retriever.named_entities("When did Leah Adler die?").tolist() == [ids["Leah Adler"]]


def test_round_trip_is_exact(built, tmp_path):
    save_index(built, tmp_path / "idx")
    loaded = load_index(tmp_path / "idx", expect_embedder="test-hash")
    assert loaded.passages == built.passages and loaded.fact_text == built.fact_text
    assert loaded.entity_names == built.entity_names and loaded.info == built.info
    assert loaded.passage_ids.tolist() == [0, 1, 2] and loaded.surfaces == built.surfaces and loaded.entity_keys == built.entity_keys
    assert loaded.entity_order.tolist() == built.entity_order.tolist() and built.entity_order.max() > 0
    np.testing.assert_array_equal(loaded.fact_passage, built.fact_passage)
    assert (loaded.fact_entities != built.fact_entities).nnz == 0
    np.testing.assert_array_equal(loaded.fact_vectors, built.fact_vectors)
    query = built.fact_vectors[2]
    assert loaded.fact_index.search(query, 3)[1].tolist() == built.fact_index.search(query, 3)[1].tolist()
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["format_version"] == 3 and manifest["embedder"] == {"id": "test-hash", "dim": 256}
    assert manifest["extractor"] == {"name": "sentences", "version": "1", "rules": 2}
    assert set(manifest["files"]) >= {"facts.jsonl", "fact_vectors.npy", "facts.faiss", "entities.faiss"}


def test_damaged_file_is_a_one_line_error(built, tmp_path):
    save_index(built, tmp_path / "idx")
    with open(tmp_path / "idx" / "fact_vectors.npy", "r+b") as handle:
        handle.seek(-4, 2)
        handle.write(b"\x00\x01\x02\x03")
    with pytest.raises(HyperProveError, match=r"fact_vectors.npy: checksum mismatch"):
        load_index(tmp_path / "idx")


@pytest.mark.parametrize("block", [1, 2, 10_000])
def test_json_lines_read_in_blocks_name_the_bad_line(tmp_path, block):
    """Facts are parsed a block of lines at a time; a text holding U+2028 stays one line, and a
    line that is not JSON (or holds two values) is named by its number whatever the block."""
    from pipeline.index.store import _jsonl_rows

    path = tmp_path / "rows.jsonl"
    rows = [{"text": "one\u2028two"}, {"text": "three"}, {"text": "four"}]
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    assert list(_jsonl_rows(path, block=block)) == rows
    for bad in ('{"text": "three"}, {"text": "3"}', '{"text": '):
        path.write_text(f'{json.dumps(rows[0])}\n{bad}\n{json.dumps(rows[2])}\n', encoding="utf-8")
        with pytest.raises(HyperProveError, match=r"rows.jsonl: line 2 is not valid JSON; the index is damaged"):
            list(_jsonl_rows(path, block=block))


def test_missing_file_manifest_and_version_errors(built, tmp_path):
    with pytest.raises(HyperProveError, match="no such index directory"):
        load_index(tmp_path / "nowhere")
    save_index(built, tmp_path / "idx")
    (tmp_path / "idx" / "entities.json").unlink()
    with pytest.raises(HyperProveError, match="entities.json: missing"):
        load_index(tmp_path / "idx")
    save_index(built, tmp_path / "v")
    manifest = json.loads((tmp_path / "v" / "manifest.json").read_text())
    (tmp_path / "v" / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(HyperProveError, match="format version 99"):
        load_index(tmp_path / "v")
    (tmp_path / "v" / "manifest.json").write_text("{not json")
    with pytest.raises(HyperProveError, match="manifest.json: not valid JSON"):
        load_index(tmp_path / "v")


def test_embedder_mismatch_is_refused(built, tmp_path):
    save_index(built, tmp_path / "idx")
    with pytest.raises(HyperProveError, match="built with embedder 'test-hash'"):
        load_index(tmp_path / "idx", expect_embedder="all-MiniLM-L6-v2")


def test_interrupted_save_leaves_the_old_index_intact(built, tmp_path, monkeypatch):
    save_index(built, tmp_path / "idx")
    before = (tmp_path / "idx" / "manifest.json").read_text()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(index_store.faiss, "write_index", crash)
    with pytest.raises(KeyboardInterrupt):
        save_index(built, tmp_path / "idx")
    assert (tmp_path / "idx" / "manifest.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".idx.lock", "idx"]  # no scratch left behind (the writer's lock file stays)
    load_index(tmp_path / "idx")


def test_refuses_to_overwrite_a_directory_that_is_not_an_index(built, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(HyperProveError, match="holds 'keep.txt', which is not part of a HyperProve index"):
        save_index(built, tmp_path / "notes")
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


GROWN = [
    Passage("Jaws (film)", "Jaws is a 1975 film directed by Steven Spielberg. It was a box-office hit."),
    Passage("Steven Spielberg", "Steven Spielberg is a director born in Cincinnati. His mother was Leah Adler."),
    Passage("Cincinnati", "Cincinnati is a city in Ohio on the Ohio River."),
    Passage("Leah Adler", "Leah Adler was a restaurateur. She died in 2017 in Los Angeles."),
    Passage("Duel (film)", "Duel is a 1971 film by Spielberg. Dennis Weaver starred in Duel."),
    Passage("Ohio River", "The Ohio River flows past Cincinnati into the Mississippi River."),
]


def test_an_index_grown_by_adding_passages_equals_one_built_on_the_whole_corpus(hash_embedder, tmp_path):
    from pipeline.index.changes import grow_index

    config = IndexConfig(eta=0.7)  # hash vectors: "Spielberg" and "Steven Spielberg" are 1/sqrt(2) = 0.71 apart
    whole = build_index(GROWN, config, hash_embedder, progress=False)
    grown = grow_index(build_index(GROWN[:3], config, hash_embedder, progress=False), GROWN[3:], config, hash_embedder, progress=False)
    save_index(grown, tmp_path / "grown")
    grown = load_index(tmp_path / "grown")
    assert (grown.passages, grown.fact_text, grown.fact_passage.tolist(), grown.entity_names) == (
        whole.passages, whole.fact_text, whole.fact_passage.tolist(), whole.entity_names)
    assert (grown.fact_entities != whole.fact_entities).nnz == 0
    # "Spielberg" arrives with Duel, a new name, and pairs with the old "Steven Spielberg"
    names = [normalise_entity(n) for n in whole.entity_names]
    pair = (names.index("steven spielberg"), names.index("spielberg"))
    assert whole.synonyms[pair] == 1 and (grown.synonyms != whole.synonyms).nnz == 0
    for name in ("fact", "entity", "passage"):
        assert np.array_equal(getattr(grown, f"{name}_vectors"), getattr(whole, f"{name}_vectors"))
    assert grown.info["corpus_sha256"] == whole.info["corpus_sha256"]
    assert [(g["generation"], g["added"], g.get("first_passage_id")) for g in grown.info["generations"]] == [(0, 3, None), (1, 3, 3)]
    assert grown.passage_ids.tolist() == list(range(6)) and grown.surfaces == whole.surfaces
    from modules.retrieval.retriever import RetrieverConfig

    for query, frontier in [("Who directed Duel?", []), ("Where was the director of Jaws born?", [0]), ("Ohio River", [])]:
        ours = grown.retriever(RetrieverConfig(top_k=3), hash_embedder.encode_query)(query, frontier=frontier)
        theirs = whole.retriever(RetrieverConfig(top_k=3), hash_embedder.encode_query)(query, frontier=frontier)
        assert (ours.passages, [f.id for f in ours.facts]) == (theirs.passages, [f.id for f in theirs.facts])


def test_an_index_grows_only_with_the_extractor_it_was_built_with(built, hash_embedder):
    from pipeline.index.changes import grow_index

    class Other:
        name = "lm"

    with pytest.raises(HyperProveError, match="built with the 'sentences' extractor; grow it with the same, not 'lm'"):
        grow_index(built, GROWN[3:], IndexConfig(), hash_embedder, progress=False, extractor=Other())


@pytest.mark.parametrize("seed", range(5))
def test_grown_synonyms_equal_a_full_search_even_where_new_names_push_old_pairs_out(seed):
    """Dense clusters (like dates: "2008", "May 2008", ...) give names more near neighbours than
    the lists hold, so a new name can push an old pair out; the full search is the reference."""
    from modules.retrieval.vectors import VectorIndex
    from pipeline.index.changes import grow_synonyms

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, 16))
    vectors = centres[rng.integers(0, 4, size=60)] + 0.35 * rng.normal(size=(60, 16))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    first_new, eta, neighbors = 35, 0.8, 3
    old, _ = synonym_matrix(vectors[:first_new], eta, neighbors, exact_max=1000)
    whole, _ = synonym_matrix(vectors, eta, neighbors, exact_max=1000)
    grown = grow_synonyms(old, vectors, VectorIndex.build(vectors), first_new, eta, neighbors)
    assert (old != whole[:first_new, :first_new]).nnz > 0  # the case this is about: old pairs did change
    assert (grown != whole).nnz == 0


SHRUNK = [
    Passage("Milky Way (restaurant)", "Léah Adler ran the Milky Way restaurant."),  # names Leah Adler first, with an accent
    *GROWN[:2], GROWN[3], GROWN[4], GROWN[2],
]


def keyed(index) -> dict:
    """An index in terms of entity keys, not ids: what two indexes of one corpus must share."""
    keys = [normalise_entity(name) for name in index.entity_names]
    coo = index.fact_entities.tocoo()
    pairs = index.synonyms.tocoo()
    return {
        "names": dict(zip(keys, index.entity_names)),
        "incidence": sorted((int(r), keys[c]) for r, c in zip(coo.row, coo.col)),
        "synonyms": sorted((keys[r], keys[c]) for r, c in zip(pairs.row, pairs.col)),
        "surfaces": sorted((row, keys[e], name) for (row, e), name in index.surfaces.items()),
        "entity_vectors": {k: v.tolist() for k, v in zip(keys, index.entity_vectors)},
        "facts": (index.fact_text, index.fact_passage.tolist()), "passages": index.passages,
    }


def test_an_index_shrunk_by_deleting_passages_equals_one_built_without_them(hash_embedder, tmp_path):
    """Deleting the restaurant and Duel: "Leah Adler" loses the fact that named it (with an
    accent) and takes the name of her next fact; "Spielberg", "Dennis Weaver" and "Duel" leave,
    and with "Spielberg" its synonym pair with "Steven Spielberg"."""
    from modules.retrieval.retriever import RetrieverConfig
    from pipeline.index.changes import shrink_index

    config = IndexConfig(eta=0.7)
    built = build_index(SHRUNK, config, hash_embedder, progress=False)
    assert built.entity_names[built.fact_entities[0].indices[0]] == "Léah Adler"
    assert any(name == "Leah Adler" for name in built.surfaces.values())
    save_index(built, tmp_path / "idx")
    shrunk = shrink_index(load_index(tmp_path / "idx"), np.array([0, 4]), config, hash_embedder)
    save_index(shrunk, tmp_path / "idx")
    shrunk = load_index(tmp_path / "idx")
    kept = [p for k, p in enumerate(SHRUNK) if k not in (0, 4)]
    whole = build_index(kept, config, hash_embedder, progress=False)
    assert keyed(shrunk) == keyed(whole)
    # numbered as a build numbers them: "Leah Adler" (id 0 before) now comes after Cincinnati, her first fact's
    assert shrunk.entity_names == whole.entity_names and shrunk.entity_names.index("Leah Adler") == 4
    assert (shrunk.fact_entities != whole.fact_entities).nnz == 0 and (shrunk.synonyms != whole.synonyms).nnz == 0
    assert np.array_equal(shrunk.entity_vectors, whole.entity_vectors) and shrunk.surfaces == whole.surfaces
    assert "Leah Adler" in shrunk.entity_names and "Léah Adler" not in shrunk.entity_names
    assert shrunk.entity_keys == [normalise_entity(name) for name in shrunk.entity_names]
    assert not {"spielberg", "dennis weaver", "duel"} & {normalise_entity(n) for n in shrunk.entity_names}
    assert keyed(built)["synonyms"] == [("ohio", "ohio river"), ("ohio river", "ohio"), ("spielberg", "steven spielberg"), ("steven spielberg", "spielberg")]
    assert keyed(shrunk)["synonyms"] == [("ohio", "ohio river"), ("ohio river", "ohio")]  # the pair left with "Spielberg"
    for name in ("fact", "passage"):
        assert np.array_equal(getattr(shrunk, f"{name}_vectors"), getattr(whole, f"{name}_vectors"))
    assert shrunk.passage_ids.tolist() == [1, 2, 3, 5] and shrunk.counts() == whole.counts()
    assert shrunk.info["corpus_sha256"] == whole.info["corpus_sha256"]
    change = shrunk.info["generations"][-1]
    assert (change["generation"], change["removed"], change["facts_removed"], change["renamed"]) == (1, 2, 3, 1)
    assert change["removed_passages"] == [[0, "Milky Way (restaurant)"], [4, "Duel (film)"]]
    for query, frontier in [("Who was the mother of Steven Spielberg?", []), ("Where was the director of Jaws born?", [0]), ("Leah Adler", [])]:
        ours = shrunk.retriever(RetrieverConfig(top_k=3), hash_embedder.encode_query)(query, frontier=frontier)
        theirs = whole.retriever(RetrieverConfig(top_k=3), hash_embedder.encode_query)(query, frontier=frontier)
        assert (ours.passages, [f.id for f in ours.facts]) == (theirs.passages, [f.id for f in theirs.facts])


def test_passage_ids_stay_through_deletions_and_additions(hash_embedder, tmp_path):
    from pipeline.index.changes import grow_index, shrink_index

    config = IndexConfig(eta=0.7)
    index = shrink_index(build_index(GROWN[:4], config, hash_embedder, progress=False), np.array([1]), config, hash_embedder)
    index = grow_index(index, GROWN[4:], config, hash_embedder, progress=False)
    assert index.passage_ids.tolist() == [0, 2, 3, 4, 5]  # 1 is never given again
    assert [p.title for p in index.passages] == [GROWN[k].title for k in (0, 2, 3, 4, 5)]
    assert keyed(index) == keyed(build_index([GROWN[k] for k in (0, 2, 3, 4, 5)], config, hash_embedder, progress=False))


def test_delete_by_id_or_title_and_again(hash_embedder, tmp_path):
    from pipeline.config import HyperProveConfig
    from pipeline.index.commands import delete_from_index
    from pipeline.runtime import Runtime

    config = HyperProveConfig().with_overrides(index={"embedder": "test-hash", "eta": 0.7})
    runtime = Runtime(config, embedder=hash_embedder)
    save_index(build_index(SHRUNK, config.index, hash_embedder, progress=False), tmp_path / "idx")
    wanted = tmp_path / "ids.json"
    wanted.write_text(json.dumps([4, "Milky Way (restaurant)"]))
    said = []
    result = delete_from_index(wanted, tmp_path / "idx", config, runtime, log=said.append)
    assert (result["generation"], result["removed"], result["passages"]) == (1, 2, 4)
    result = delete_from_index(wanted, tmp_path / "idx", config, runtime, log=said.append)  # again: nothing left to do
    assert (result["generation"], result["removed"]) == (1, 0)
    assert said[-3:] == [f"{wanted}: item 0 (4) was removed in generation 1: skipped",
                         f"{wanted}: item 1 ('Milky Way (restaurant)') was removed in generation 1: skipped",
                         f"{tmp_path / 'idx'}: nothing to delete; generation 1 stays"]
    for items, message in [([99], "item 0: no passage id 99 in the index"), ([1, "Jaw"], "item 1: no passage titled 'Jaw' in the index"),
                           ([[1]], "item 0 must be a passage id \\(an integer\\) or a title \\(a string\\), found list"),
                           ([True], "found bool"), ([], "the deletions list is empty"),
                           ([1, 2, 3, 5], "names every passage of .*; an index needs at least one")]:
        wanted.write_text(json.dumps(items))
        with pytest.raises(HyperProveError, match=message):
            delete_from_index(wanted, tmp_path / "idx", config, runtime, log=said.append)
    assert load_index(tmp_path / "idx").generation == 1


@pytest.mark.parametrize("seed", range(5))
def test_shrunk_synonyms_equal_a_full_search_where_names_leave_or_change(seed):
    """A name that leaves frees a place in its neighbours' lists for another pair; a renamed one
    moves: the full search of the names left is the reference."""
    from modules.retrieval.vectors import VectorIndex
    from pipeline.index.changes import shrink_synonyms

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, 16))
    unit = lambda v: (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)  # noqa: E731
    vectors = unit(centres[rng.integers(0, 4, size=60)] + 0.35 * rng.normal(size=(60, 16)))
    eta, neighbors = 0.8, 3
    alive = rng.random(60) > 0.2
    renamed = np.sort(rng.choice(np.flatnonzero(alive), size=3, replace=False))
    after = vectors.copy()
    after[renamed] = unit(centres[rng.integers(0, 4, size=3)] + 0.35 * rng.normal(size=(3, 16)))
    before, _ = synonym_matrix(vectors, eta, neighbors, exact_max=1000)
    new_ids = np.full(60, -1)
    new_ids[alive] = rng.permutation(alive.sum())  # the names left, numbered again in another order
    left = np.empty((alive.sum(), 16), dtype=np.float32)
    left[new_ids[alive]] = after[alive]
    shrunk = shrink_synonyms(before, new_ids, renamed, left, VectorIndex.build(left), eta, neighbors)
    whole, _ = synonym_matrix(left, eta, neighbors, exact_max=1000)
    kept = np.flatnonzero(alive)[np.argsort(new_ids[alive])]
    assert (before[kept][:, kept] != whole).nnz > 0  # the case this is about: pairs did change
    assert (shrunk != whole).nnz == 0


def unit_rows(rng, n: int, dim: int) -> np.ndarray:
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("exact_max, compressed_min, built_on", [(10_000, 10_000, 3000), (100, 10_000, 3000), (100, 10_000, 2500),
                                                                 (100, 1000, 3000), (100, 1000, 2500)])
def test_vector_index_rows_removed_and_replaced_as_in_the_array(exact_max, compressed_min, built_on):
    """Exact, IVF, IVF-PQ, and IVF or IVF-PQ with 500 vectors added after it was built (kept in
    its `added` part)."""
    from modules.retrieval.vectors import VectorIndex

    vectors = unit_rows(np.random.default_rng(0), 3000, 48)
    index = VectorIndex.build(vectors[:built_on], exact_max=exact_max, compressed_min=compressed_min)
    index.add(vectors[built_on:])
    kind = "exact" if exact_max > 3000 else "ivf" if compressed_min > built_on else "ivfpq"
    assert index.kind == kind and len(index.parts) == (2 if built_on < 3000 else 1)
    index.remove(np.array([2999, 5, 17, 100, 5]))
    left = np.delete(vectors, [5, 17, 100, 2999], axis=0)
    left[[0, 7, 2000]] = vectors[[3000 - 1, 17, 5]]  # rows given the vectors of removed ones
    index.replace(np.array([0, 7, 2000]), left[[0, 7, 2000]])
    index.rows = left  # the array the index mirrors (a HypergraphIndex hands its own over)
    assert len(index) == 2996
    _, ids = index.search(left, 1, nprobe=10_000)  # every list scanned: each row finds itself
    assert ids[:, 0].tolist() == list(range(2996))


def test_an_ivf_pq_search_ranks_its_candidates_by_the_stored_vectors():
    """Codes pick REFINE candidates a hit; the stored rows score them. Where the candidates are
    every vector (every list scanned, k * REFINE >= n) the answer is exact search's, scores and
    all; without the rows it is the codes' approximate one."""
    from modules.retrieval.vectors import REFINE, VectorIndex

    rng = np.random.default_rng(3)
    vectors, queries = unit_rows(rng, 1500, 32), unit_rows(rng, 20, 32)
    exact = VectorIndex.build(vectors, exact_max=10_000)
    compressed = VectorIndex.build(vectors, exact_max=100, compressed_min=1000)
    assert compressed.kind == "ivfpq" and compressed.rows is vectors and 50 * REFINE >= len(vectors)
    scores, ids = compressed.search(queries, 50, nprobe=10_000)
    exact_scores, exact_ids = exact.search(queries, 50)
    assert np.array_equal(ids, exact_ids) and np.allclose(scores, exact_scores, atol=1e-6)
    compressed.rows = None
    coded, coded_ids = compressed.search(queries, 50, nprobe=10_000)
    assert not np.allclose(coded, exact_scores, atol=1e-3) and len(set(coded_ids[0]) & set(exact_ids[0])) > 25


def test_ivf_pq_has_finer_lists_and_scans_more_of_them():
    """IVF: sqrt(N) lists (64 to 1024), 16 scanned; IVF-PQ: 2 sqrt(N) (64 to 8192), 256 scanned,
    the default of a search and of a range search alike."""
    from modules.retrieval.vectors import VectorIndex, lists_for

    assert [lists_for(n, "ivf") for n in (60_000, 1_000_000, 3_000_000)] == [244, 1000, 1024]
    assert [lists_for(n, "ivfpq") for n in (1500, 3_000_000, 10_000_000, 100_000_000)] == [77, 3464, 6324, 8192]
    rng = np.random.default_rng(5)
    vectors = unit_rows(rng, 1500, 32)
    compressed, flat = VectorIndex.build(vectors, exact_max=100, compressed_min=1000), VectorIndex.build(vectors, exact_max=100)
    assert (compressed.index.nlist, compressed.index.nprobe, flat.index.nlist, flat.index.nprobe) == (77, 256, 64, 16)
    query = vectors[:1]
    assert np.array_equal(compressed.search(query, 5)[1], compressed.search(query, 5, nprobe=256)[1])
    assert not np.array_equal(compressed.within(query, 0.0)[1], compressed.within(query, 0.0, nprobe=16)[1])


def test_coded_rows_decode_each_value_within_half_a_step_of_its_range():
    """QT_8bit: a dimension's range is the sample's [min, max] widened by a tenth of its width
    each way, cut in 255 steps; code c decodes to low + (c + 0.5) steps, so a value in the range
    comes back within half a step, and one outside it as its end's code (0, or 255: half a step
    above `high`)."""
    from modules.retrieval.vectors import CodedRows

    rng = np.random.default_rng(8)
    vectors = unit_rows(rng, 500, 16)
    coded = CodedRows.trained(vectors[::5], len(vectors))
    for start in range(0, 500, 128):  # filled a block at a time
        coded.put(start, vectors[start:start + 128])
    low, high = vectors[::5].min(axis=0), vectors[::5].max(axis=0)
    low, high = low - 0.1 * (high - low), high + 0.1 * (high - low)
    step = (high - low) / 255
    inside = (vectors >= low) & (vectors <= high)
    decoded = coded[np.arange(500)]
    assert decoded.dtype == np.float32 and coded.shape == (500, 16) and len(coded) == 500
    assert np.all(np.abs(decoded - vectors)[inside] <= np.broadcast_to(step / 2, vectors.shape)[inside] + 1e-6)
    assert np.allclose(decoded[~inside], np.where(vectors > high, high + step / 2, low + step / 2)[~inside], atol=1e-5)
    assert np.array_equal(coded[np.array([7, 3])], decoded[[7, 3]]) and coded[7].shape == (1, 16)


def test_vectors_added_to_an_ivf_index_answer_as_one_index_holding_them_all():
    """The added part shares the built lists' centroids, so a search scans the same lists in
    both: the reference is one IVF index on those centroids given every vector."""
    import faiss

    from modules.retrieval.vectors import VectorIndex

    rng = np.random.default_rng(1)
    vectors = unit_rows(rng, 3500, 16)
    index = VectorIndex.build(vectors[:3000], exact_max=100)
    index.add(vectors[3000:3200])
    index.add(vectors[3200:])
    assert (index.index.ntotal, index.added.ntotal, len(index)) == (3000, 500, 3500)
    whole = faiss.IndexIVFFlat(faiss.clone_index(index.index.quantizer), 16, index.index.nlist, faiss.METRIC_INNER_PRODUCT)
    whole.add(vectors)
    queries = unit_rows(rng, 40, 16)
    for nprobe in (1, 4):
        params = faiss.SearchParametersIVF(nprobe=nprobe)
        scores, ids = index.search(queries, 10, nprobe=nprobe)
        whole_scores, whole_ids = whole.search(queries, 10, params=params)
        assert np.array_equal(ids, whole_ids) and np.allclose(scores, whole_scores)
        assert (ids >= 3000).any() and (ids < 3000).any()  # both parts answer
        rows, found, near = index.within(queries, 0.6, nprobe=nprobe)
        limits, whole_near, whole_found = whole.range_search(queries, 0.6, params=params)
        whole_rows = np.repeat(np.arange(len(queries)), np.diff(limits.astype(np.int64)))
        assert np.all(np.diff(rows) >= 0) and np.allclose(np.sort(near), np.sort(whole_near))
        assert sorted(zip(rows.tolist(), found.tolist())) == sorted(zip(whole_rows.tolist(), whole_found.tolist()))
    with pytest.raises(ValueError, match="not an IVF index on the same centroids"):
        VectorIndex(index.index, VectorIndex.build(vectors, exact_max=100).index)


def test_an_ivf_index_grown_keeps_its_added_vectors_in_a_file_beside_it(tmp_path):
    """3,000 one-fact passages over 700 names, IVF above 1,000 vectors; 400 passages added, each
    naming an old and a new name: facts and passages keep their lists and gain an added part,
    saved and loaded with them; names cross 1,000 and are built again as IVF (no added part)."""
    from dataclasses import asdict

    from experiments.bench.changes import PreparedFacts, RandomVectors
    from modules.retrieval.hypergraph import binary_csr
    from pipeline.index.build import assemble_index, corpus_checksum
    from pipeline.index.changes import grow_index

    rng = np.random.default_rng(2)
    n, names = 3000, 700
    config = IndexConfig(exact_search_max=1000)
    passages = [Passage(f"p{k}", f"text {k}") for k in range(n)]
    info = {"extractor": PreparedFacts.report(), "embedder": {"id": RandomVectors.id, "dim": RandomVectors.dim}, "config": asdict(config),
            "corpus_sha256": corpus_checksum(passages), "generations": [{"generation": 0, "added": n, "facts": n}]}
    vectors = {"fact": unit_rows(rng, n, 384), "entity": unit_rows(rng, names, 384), "passage": unit_rows(rng, n, 384)}
    index = assemble_index(passages, [f"f{k}" for k in range(n)], np.arange(n), binary_csr(np.arange(n), np.arange(n) % names, (n, names)),
                           [f"e{k}" for k in range(names)], vectors, config, info)
    added = {f"q{k}": [(f"g{k}", (f"e{k}", f"new{k}"))] for k in range(400)}
    grown = grow_index(index, [Passage(title, title) for title in added], config, RandomVectors(3), progress=False, extractor=PreparedFacts(added))
    assert grown.info["generations"][-1]["rebuilt"] == ["entity"]
    assert [len(getattr(grown, f"{name}_index").parts) for name in ("fact", "entity", "passage")] == [2, 1, 2]
    queries = grown.fact_vectors[[5, 2999, 3000, 3399]]
    before = grown.fact_index.search(queries, 3)
    assert before[1][:, 0].tolist() == [5, 2999, 3000, 3399]  # each fact finds itself, in either part
    save_index(grown, tmp_path / "grown")
    manifest = json.loads((tmp_path / "grown" / "manifest.json").read_text())
    assert sorted(name for name in manifest["files"] if ".added." in name) == ["facts.added.faiss", "passages.added.faiss"]
    loaded = load_index(tmp_path / "grown")
    assert loaded.fact_index.added.ntotal == 400 and loaded.entity_index.added is None
    after = loaded.fact_index.search(queries, 3)
    assert np.array_equal(before[1], after[1]) and np.array_equal(before[0], after[0])
    # an added part that does not belong to its index (other centroids) is refused like any damage
    (tmp_path / "grown" / "facts.added.faiss").write_bytes((tmp_path / "grown" / "passages.added.faiss").read_bytes())
    manifest["files"]["facts.added.faiss"] = manifest["files"]["passages.added.faiss"]
    manifest["manifest_sha256"] = index_store.manifest_checksum(manifest)  # edited, and signed again
    (tmp_path / "grown" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(HyperProveError, match=r"cannot be read \(ValueError: the added vectors' index is not an IVF index on the same"):
        load_index(tmp_path / "grown")


def test_rows_kept_and_appended_in_place_or_on_a_copy():
    from pipeline.index.changes import ROW_CHUNK, appended_rows, kept_rows

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(2 * ROW_CHUNK + 5, 3)).astype(np.float32)
    kept = np.sort(rng.choice(len(vectors), size=ROW_CHUNK + 7, replace=False))
    expected = vectors[kept].copy()
    assert np.array_equal(kept_rows(vectors.copy(), kept), expected)  # owned: moved up in place, over chunk borders
    view = np.vstack([vectors, vectors])[: len(vectors)]  # a view cannot be resized: a copy is made
    assert np.array_equal(kept_rows(view, kept), expected)
    runs = np.delete(np.arange(len(vectors)), [3, 4, ROW_CHUNK + 100])  # long runs of kept rows, moved as slices over chunk borders
    assert np.array_equal(kept_rows(vectors.copy(), runs), vectors[runs]) and kept_rows(vectors.copy(), runs[:0]).shape == (0, 3)
    numbered = np.concatenate([np.arange(0, 40), [45], np.arange(41, 45), np.arange(46, ROW_CHUNK + 300), [2], [ROW_CHUNK + 400]])
    numbered = np.delete(numbered, [2])  # row 2 moves far later, row 45 a little earlier, row 40 leaves
    for order in (numbered, rng.permutation(len(vectors))[:500]):  # mostly in order; and any order at all
        assert np.array_equal(kept_rows(vectors.copy(), order), vectors[order])
    grown = appended_rows(expected.copy(), np.ones((2, 3), dtype=np.float32))
    assert grown.shape == (len(kept) + 2, 3) and np.array_equal(grown[: len(kept)], expected) and (grown[-2:] == 1).all()


def test_the_retrain_rule_builds_a_changed_vector_index_again_when_it_no_longer_fits():
    """IVF lists trained on n vectors serve from n/2 to 2n; past exact_search_max the index
    becomes IVF (and exact again below it), as a fresh build would make it."""
    from modules.retrieval.vectors import VectorIndex
    from pipeline.index.changes import settle_vector_indexes

    rng = np.random.default_rng(0)
    pool = rng.normal(size=(7000, 8)).astype(np.float32)
    config = IndexConfig(exact_search_max=2900)
    sizes = {"fact": 3000, "entity": 2800, "passage": 3000}
    indexes = {name: VectorIndex.build(pool[:n], exact_max=2900) for name, n in sizes.items()}
    info = {"built_on": dict(sizes)}
    assert [indexes[name].kind for name in sizes] == ["ivf", "exact", "ivf"]
    for name, n in {"fact": 6000, "entity": 3000, "passage": 6001}.items():  # facts at 2x: stays; passages past 2x: retrained
        indexes[name].add(pool[sizes[name] : n])
    vectors = {"fact": pool[:6000], "entity": pool[:3000], "passage": pool[:6001]}
    untouched = indexes["fact"]
    assert settle_vector_indexes(indexes, vectors, info, config) == ["entity", "passage"]  # entities crossed 2,900: now IVF
    assert indexes["fact"] is untouched and [indexes[name].kind for name in sizes] == ["ivf", "ivf", "ivf"]
    assert info["built_on"] == {"fact": 3000, "entity": 3000, "passage": 6001}
    indexes["fact"].remove(np.arange(1400, 6000))  # below half of the 3,000 its lists were trained on: retrained, still IVF
    vectors["fact"] = pool[:1400]
    assert settle_vector_indexes(indexes, vectors, info, IndexConfig(exact_search_max=1000)) == ["fact"]
    assert indexes["fact"].kind == "ivf" and info["built_on"]["fact"] == 1400
    indexes["fact"].remove(np.arange(900, 1400))  # below exact_search_max: exact again
    vectors["fact"] = pool[:900]
    assert settle_vector_indexes(indexes, vectors, info, IndexConfig(exact_search_max=1000)) == ["fact"] and indexes["fact"].kind == "exact"


def test_a_deletion_numbers_entities_as_a_build_would_even_within_one_fact(hash_embedder):
    """Cincinnati was named first (by the restaurant); with it and Jaws deleted, Steven
    Spielberg and Cincinnati are both first named by "Steven Spielberg is a director born in
    Cincinnati.", in that order: a build numbers Spielberg first, though his old id is higher."""
    from pipeline.index.changes import shrink_index

    corpus = [Passage("Milky Way (restaurant)", "Léah Adler ran the Milky Way restaurant in Cincinnati."), *GROWN]
    config = IndexConfig(eta=0.7)
    built = build_index(corpus, config, hash_embedder, progress=False)
    assert built.entity_keys.index("cincinnati") < built.entity_keys.index("steven spielberg")
    shrunk = shrink_index(built, np.array([0, 1]), config, hash_embedder)
    whole = build_index(corpus[2:], config, hash_embedder, progress=False)
    assert shrunk.entity_names[:2] == whole.entity_names[:2] == ["Steven Spielberg", "Cincinnati"]
    assert shrunk.entity_names == whole.entity_names and (shrunk.fact_entities != whole.fact_entities).nnz == 0
    assert shrunk.entity_order.tolist() == whole.entity_order.tolist() and (shrunk.synonyms != whole.synonyms).nnz == 0


def test_an_index_searched_by_pq_codes_is_saved_and_loaded_with_its_rows(tmp_path):
    from dataclasses import asdict

    from modules.retrieval.hypergraph import binary_csr
    from modules.retrieval.vectors import VectorIndex
    from pipeline.index.build import assemble_index, corpus_checksum

    rng = np.random.default_rng(4)
    n = 1200
    config = IndexConfig(exact_search_max=100, compressed_search_min=1000)
    passages = [Passage(f"p{k}", f"text {k}") for k in range(n)]
    info = {"extractor": {"name": "sentences"}, "embedder": {"id": "random", "dim": 48}, "config": asdict(config),
            "corpus_sha256": corpus_checksum(passages), "generations": [{"generation": 0, "added": n, "facts": n}],
            "next_passage_id": n}
    vectors = {"fact": unit_rows(rng, n, 48), "entity": unit_rows(rng, 300, 48), "passage": unit_rows(rng, n, 48)}
    index = assemble_index(passages, [f"f{k}" for k in range(n)], np.arange(n), binary_csr(np.arange(n), np.arange(n) % 300, (n, 300)),
                           [f"e{k}" for k in range(300)], vectors, config, info)
    assert [index.fact_index.kind, index.entity_index.kind, index.passage_index.kind] == ["ivfpq", "ivf", "ivfpq"]
    assert VectorIndex.kind_for(1000, 100, 10) == "ivf"  # under PQ_MIN vectors: never compressed
    assert index.fact_index.rows is index.fact_vectors and not index.row_codes  # built: the vectors are in memory
    save_index(index, tmp_path / "idx")
    loaded = load_index(tmp_path / "idx")
    # the vectors IVF-PQ searches are memory-mapped (kept for updates and saves), and so are the entity
    # vectors (queries never read them); queries read the IVF-PQ sets' rows from 8-bit codes
    assert isinstance(loaded.fact_vectors, np.memmap) and isinstance(loaded.entity_vectors, np.memmap)
    assert not isinstance(loaded.passage_vectors, np.memmap) or loaded.passage_index.kind == "ivfpq"
    assert np.array_equal(loaded.fact_vectors, index.fact_vectors)
    assert sorted(loaded.row_codes) == ["fact", "passage"] and loaded.fact_index.rows is loaded.row_codes["fact"]
    assert loaded.fact_table.vectors is loaded.row_codes["fact"] and loaded.entity_index.rows is loaded.entity_vectors
    assert np.abs(loaded.fact_table.vectors[np.arange(n)] - index.fact_vectors).max() < 0.01
    # the codes are mapped from derived/, which the save wrote; a full load codes the vectors alike
    assert isinstance(loaded.row_codes["fact"].codes, np.memmap)
    # and read through once in the background, so that queries find them in the page cache
    loaded.reading.join(timeout=30)
    coded_bytes = sum((tmp_path / "idx" / "derived" / f"{name}_codes.npy").stat().st_size for name in ("fact", "passage"))
    assert not loaded.reading.is_alive() and loaded.reading.read_bytes == coded_bytes > 2 * n * 48
    shutil.rmtree(tmp_path / "idx" / "derived")
    checked = load_index(tmp_path / "idx")
    assert checked.reading is None  # its codes were computed in memory
    for name in ("fact", "passage"):
        assert not isinstance(checked.row_codes[name].codes, np.memmap)
        assert np.array_equal(checked.row_codes[name].codes, loaded.row_codes[name].codes)
        assert np.array_equal(checked.row_codes[name].ranges(), loaded.row_codes[name].ranges())
    queries = index.fact_vectors[[0, 600, 1199]]
    ids = loaded.fact_index.search(queries, 1, nprobe=10_000)[1]
    assert ids[:, 0].tolist() == [0, 600, 1199] and json.loads((tmp_path / "idx" / "manifest.json").read_text())["vector_search"]["fact"] == "ivfpq"
    retriever = loaded.retriever(RetrieverConfig(lexical_seeds=0, lexical_weight=0.0), lambda q: queries[0])
    exact = index.retriever(RetrieverConfig(lexical_seeds=0, lexical_weight=0.0), lambda q: queries[0])
    coded, truth = retriever("q").facts, exact("q").facts
    assert [f.id for f in coded][:3] == [f.id for f in truth][:3] and abs(coded[0].cos - truth[0].cos) < 0.01


def same_parts(a, b) -> bool:
    """Every part of two indexes that a load reads from passages.jsonl and facts.jsonl, and the rest."""
    return (a.passages == b.passages and a.passage_ids.tolist() == b.passage_ids.tolist() and a.fact_text == b.fact_text
            and a.fact_passage.tolist() == b.fact_passage.tolist() and (a.fact_entities != b.fact_entities).nnz == 0
            and a.fact_entities.indices.tolist() == b.fact_entities.indices.tolist() and a.entity_order.tolist() == b.entity_order.tolist()
            and a.surfaces == b.surfaces and a.entity_names == b.entity_names and a.info == b.info
            and np.array_equal(a.fact_vectors, b.fact_vectors) and np.array_equal(a.entity_vectors, b.entity_vectors))


def test_a_load_reads_the_checked_columns_until_a_file_changes(hash_embedder, tmp_path, monkeypatch):
    """The writer leaves derived/ (columns, and a stamp of every file); a load that finds every
    stamp as recorded reads the columns and hashes nothing. A changed listed file is checked in
    full again (an edit made at once after the save is caught); a changed derived file is
    ignored and written anew."""
    from pipeline.index import derived

    corpus = [*SHRUNK[:-1], Passage(SHRUNK[-1].title, SHRUNK[-1].text, source="docs/duel.md")]
    built = build_index(corpus, IndexConfig(eta=0.7), hash_embedder, progress=False)
    assert built.surfaces and built.entity_order.max() > 0  # the columns carry surface names and listed order
    save_index(built, tmp_path / "idx")
    folder = tmp_path / "idx" / "derived"
    record = json.loads((folder / "record.json").read_text())
    assert set(record["stamps"]) >= {"facts.jsonl", "passages.jsonl", "derived/fact_text.txt", "derived/fact_entity_ids.npy"}

    def fail(*args, **kwargs):
        raise AssertionError("hashed or parsed")

    with monkeypatch.context() as patched:
        patched.setattr(index_store, "sha256_files", fail)
        patched.setattr(index_store, "_jsonl_rows", fail)
        fast = load_index(tmp_path / "idx")
    assert same_parts(fast, built) and fast.passages[-1].source == "docs/duel.md"
    (folder / "fact_text.txt").write_text("damaged")  # a derived file changed: ignored, and written anew
    assert same_parts(load_index(tmp_path / "idx"), built) and (folder / "fact_text.txt").read_text() != "damaged"
    with open(tmp_path / "idx" / "passages.jsonl", "r+b") as handle:  # a listed file changed in place, at once
        handle.write(b"[")
    with pytest.raises(HyperProveError, match=r"passages.jsonl: checksum mismatch"):
        load_index(tmp_path / "idx")
    assert derived.read_derived(tmp_path / "idx", index_store.read_manifest(tmp_path / "idx"), []) is None


@pytest.mark.parametrize("texts", [[], ["", "a", ""], ["Léah\r\nAdler", "one\u2028two", "漢字", "x" * 5]])
def test_text_columns_keep_every_text_as_it_was(tmp_path, texts, monkeypatch):
    from pipeline.index import derived

    monkeypatch.setattr(derived, "TEXT_BLOCK", 2)  # several blocks
    derived.write_texts(tmp_path / "t.txt", texts)
    assert derived.read_texts(tmp_path / "t.txt") == texts


def test_the_entity_index_is_read_on_first_use_from_the_files_the_load_checked(built, tmp_path):
    """Queries never search entity names, so a load that trusts its record leaves their FAISS
    file (3 GB at 10M facts) until an update or a baseline asks; a file replaced meanwhile is refused."""
    save_index(built, tmp_path / "idx")
    loaded, again = load_index(tmp_path / "idx"), load_index(tmp_path / "idx")
    assert loaded.entity_index.deferred and not loaded.fact_index.deferred
    query = built.entity_vectors[3]
    assert loaded.entity_index.search(query, 2)[1].tolist() == built.entity_index.search(query, 2)[1].tolist()
    assert not loaded.entity_index.deferred
    shutil.copy(tmp_path / "idx" / "entities.faiss", tmp_path / "copy")
    shutil.move(tmp_path / "copy", tmp_path / "idx" / "entities.faiss")  # the same bytes, another file
    with pytest.raises(HyperProveError, match=r"entities.faiss: changed or gone since the index was loaded; load it again"):
        again.entity_index.search(query, 2)
