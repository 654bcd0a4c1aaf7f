"""Entity normalisation, synonyms, the index build and its on-disk format."""

import json

import numpy as np
import pytest

from conftest import dense
from modules.errors import HyperProveError
from modules.facts import Passage
from pipeline import index as index_module
from pipeline.config import IndexConfig
from pipeline.index import build_index, load_index, normalise_entity, save_index, synonym_matrix

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


def test_round_trip_is_exact(built, tmp_path):
    save_index(built, tmp_path / "idx")
    loaded = load_index(tmp_path / "idx", expect_embedder="test-hash")
    assert loaded.passages == built.passages and loaded.fact_text == built.fact_text
    assert loaded.entity_names == built.entity_names and loaded.info == built.info
    np.testing.assert_array_equal(loaded.fact_passage, built.fact_passage)
    assert (loaded.fact_entities != built.fact_entities).nnz == 0
    np.testing.assert_array_equal(loaded.fact_vectors, built.fact_vectors)
    query = built.fact_vectors[2]
    assert loaded.fact_index.search(query, 3)[1].tolist() == built.fact_index.search(query, 3)[1].tolist()
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["embedder"] == {"id": "test-hash", "dim": 256}
    assert manifest["extractor"] == {"name": "sentences", "version": "1"}
    assert set(manifest["files"]) >= {"facts.jsonl", "fact_vectors.npy", "facts.faiss", "entities.faiss"}


def test_damaged_file_is_a_one_line_error(built, tmp_path):
    save_index(built, tmp_path / "idx")
    with open(tmp_path / "idx" / "fact_vectors.npy", "r+b") as handle:
        handle.seek(-4, 2)
        handle.write(b"\x00\x01\x02\x03")
    with pytest.raises(HyperProveError, match=r"fact_vectors.npy: checksum mismatch"):
        load_index(tmp_path / "idx")


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

    monkeypatch.setattr(index_module.faiss, "write_index", crash)
    with pytest.raises(KeyboardInterrupt):
        save_index(built, tmp_path / "idx")
    assert (tmp_path / "idx" / "manifest.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # no scratch left behind
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
    from pipeline.index import grow_index

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
    assert [(g["generation"], g["added"], g.get("first_passage")) for g in grown.info["generations"]] == [(0, 3, None), (1, 3, 3)]
    from modules.retriever import RetrieverConfig

    for query, frontier in [("Who directed Duel?", []), ("Where was the director of Jaws born?", [0]), ("Ohio River", [])]:
        ours = grown.retriever(RetrieverConfig(top_k=3), hash_embedder.encode_query)(query, frontier=frontier)
        theirs = whole.retriever(RetrieverConfig(top_k=3), hash_embedder.encode_query)(query, frontier=frontier)
        assert (ours.passages, [f.id for f in ours.facts]) == (theirs.passages, [f.id for f in theirs.facts])


def test_an_index_grows_only_with_the_extractor_it_was_built_with(built, hash_embedder):
    from pipeline.index import grow_index

    class Other:
        name = "lm"

    with pytest.raises(HyperProveError, match="built with the 'sentences' extractor; grow it with the same, not 'lm'"):
        grow_index(built, GROWN[3:], IndexConfig(), hash_embedder, progress=False, extractor=Other())


@pytest.mark.parametrize("seed", range(5))
def test_grown_synonyms_equal_a_full_search_even_where_new_names_push_old_pairs_out(seed):
    """Dense clusters (like dates: "2008", "May 2008", ...) give names more near neighbours than
    the lists hold, so a new name can push an old pair out; the full search is the reference."""
    from modules.vectors import VectorIndex
    from pipeline.index import grow_synonyms

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
