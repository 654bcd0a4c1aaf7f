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
