"""A folder indexed in checkpointed batches: the index one read of the folder gives, and a build
killed part-way that resumes at its first unfinished batch and ends with the same index."""

import json

import numpy as np

import pipeline.index.ingest as ingest
from pipeline.config import HyperProveConfig
from pipeline.index.build import build_index
from pipeline.index.documents import read_folder
from pipeline.index.ingest import building_folder, ingest_folder
from pipeline.runtime import Runtime
from tests.support import HashEmbedder, run


def write_docs(docs):
    """Eight files, read two at a time: four batches. The third batch repeats a passage of the
    first (dropped there, its file kept for its other passage), the fourth a whole file of the
    first (skipped), and one file of the second is not text."""
    docs.mkdir()
    (docs / "a.md").write_text("# Ada Lovelace\n\nAda Lovelace was a mathematician in London.\n\n## Family\nHer father was Lord Byron.\n")
    (docs / "b.txt").write_text("Charles Babbage\n\nCharles Babbage was born in London in 1791.")
    (docs / "c.html").write_text("<title>Lord Byron</title><p>Lord Byron was a poet. He died in Greece in 1824.</p>")
    (docs / "d.txt").write_bytes(b"\x00\x01\x02")
    (docs / "e.md").write_text("# Ada Lovelace\n\nAda Lovelace was a mathematician in London.\n\n## Work\nShe wrote a program for the Engine.\n")
    (docs / "f.md").write_text("# Analytical Engine\n\nThe Analytical Engine was designed by Charles Babbage.\n")
    (docs / "g.md").write_text("# Ada Lovelace\n\nAda Lovelace was a mathematician in London.\n")
    (docs / "h.txt").write_text("Greece\n\nGreece is a country where Lord Byron died.")


def folder_config(**index):
    return HyperProveConfig().with_overrides(index={"embedder": "test-hash", "eta": 0.7, "batch_files": 2, **index})


def same_index(ours, theirs) -> None:
    assert [(p.title, p.text, p.source) for p in ours.passages] == [(p.title, p.text, p.source) for p in theirs.passages]
    assert (ours.fact_text, ours.fact_passage.tolist(), ours.entity_names) == (theirs.fact_text, theirs.fact_passage.tolist(), theirs.entity_names)
    assert (ours.fact_entities != theirs.fact_entities).nnz == 0 and (ours.synonyms != theirs.synonyms).nnz == 0
    assert ours.entity_order.tolist() == theirs.entity_order.tolist() and ours.surfaces == theirs.surfaces
    for name in ("fact", "entity", "passage"):
        assert np.array_equal(getattr(ours, f"{name}_vectors"), getattr(theirs, f"{name}_vectors"))
    assert ours.info == theirs.info


def test_a_folder_indexed_in_batches_is_the_index_of_one_read_of_it(tmp_path):
    write_docs(tmp_path / "docs")
    config = folder_config()
    runtime = Runtime(config, embedder=HashEmbedder())
    lines = []
    index, corpus = ingest_folder(tmp_path / "docs", tmp_path / "idx", config, runtime, log=lines.append)
    read = read_folder(tmp_path / "docs", log=lambda line: None)
    same_index(index, build_index(read.passages, config.index, HashEmbedder(), progress=False))
    assert corpus.files == read.files and "g.md" not in corpus.files and "e.md" in corpus.files
    assert [p.source for p in corpus.passages] == ["a.md#0", "a.md#1", "b.txt#0", "c.html#0", "e.md#1", "f.md#0", "h.txt#0"]
    assert sorted(corpus.skipped) == sorted(read.skipped) == [
        f"{tmp_path / 'docs' / 'd.txt'}: skipped: not a readable TXT file (binary data, not text (it holds NUL bytes))",
        f"{tmp_path / 'docs' / 'g.md'}: skipped: every passage repeats an earlier file's"]
    assert corpus.summary() == read.summary()
    # each batch left its checkpoint: named by number and key, its passages before the folder-wide repeats were dropped
    parts = sorted(path.name for path in building_folder(tmp_path / "idx").iterdir())
    assert [name[:5] for name in parts] == ["00000", "00001", "00002", "00003"]
    third = json.loads((building_folder(tmp_path / "idx") / parts[2] / "part.json").read_text())
    assert [p[2] for p in third["passages"]] == ["e.md#0", "e.md#1", "f.md#0"]


def test_a_killed_build_resumes_at_its_first_unfinished_batch_and_gives_the_uninterrupted_index(tmp_path, capsys, monkeypatch):
    write_docs(tmp_path / "docs")
    flags = ["--embedder", "test-hash", "--eta", "0.7", "--batch-files", "2", "--json"]
    code, _, _ = run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "whole", *flags)
    assert code == 0 and not building_folder(tmp_path / "whole").exists()  # the checkpoints go once the index is written

    done, kill = [], {"at": 2}
    work = ingest.ingest_batch

    def counted(root, files, *args):  # the batches done, and a kill when the third starts
        if len(done) == kill["at"]:
            raise KeyboardInterrupt
        done.append([relative for _, relative in files])
        return work(root, files, *args)

    monkeypatch.setattr(ingest, "ingest_batch", counted)
    code, _, err = run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "idx", *flags)
    assert code == 130 and "run the same command again to resume" in err
    assert not (tmp_path / "idx").exists() and len(list(building_folder(tmp_path / "idx").iterdir())) == 2

    done.clear()
    kill["at"] = None
    monkeypatch.setattr("pipeline.index.commands.finish", lambda out: None)  # from here the checkpoints stay
    code, out, _ = run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "idx", *flags)
    assert code == 0 and "resuming: 2 of 4 batches were finished earlier" in out
    assert done == [["e.md", "f.md"], ["g.md", "h.txt"]]  # only the batches the kill left
    assert manifest_files(tmp_path / "idx") == manifest_files(tmp_path / "whole")

    # a changed file: only its batch is done again
    (tmp_path / "docs" / "b.txt").write_text("Charles Babbage\n\nCharles Babbage was born in London in 1791, the son of a banker.")
    done.clear()
    code, out, _ = run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "idx", *flags)
    assert code == 0 and "resuming: 3 of 4 batches" in out and done == [["a.md", "b.txt"]]
    assert run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "again", *flags)[0] == 0
    assert manifest_files(tmp_path / "idx") == manifest_files(tmp_path / "again") != manifest_files(tmp_path / "whole")

    # a damaged checkpoint: that batch is done again, and said so
    vectors = next(building_folder(tmp_path / "idx").glob("00002-*")) / "fact_vectors.npy"
    vectors.write_bytes(vectors.read_bytes()[:-4])
    done.clear()
    code, out, _ = run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "idx", *flags)
    assert code == 0 and "resuming: 4 of 4 batches" in out and f"{vectors.parent}: damaged; the batch is done again" in out
    assert done == [["e.md", "f.md"]] and manifest_files(tmp_path / "idx") == manifest_files(tmp_path / "again")


def manifest_files(directory) -> dict:
    """Every file of an index by its sha256: equal, byte for byte."""
    return {name: entry["sha256"] for name, entry in json.loads((directory / "manifest.json").read_text())["files"].items()}


def test_a_folder_without_text_is_one_line_and_leaves_no_checkpoints(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "empty.md").write_text("\n\n")
    code, _, err = run(capsys, "index", tmp_path / "docs", "--out", tmp_path / "idx", "--embedder", "test-hash")
    assert code == 2 and err.strip().splitlines()[-1] == f"error: {tmp_path / 'docs'}: no document with text in it (1 skipped)"
    assert not building_folder(tmp_path / "idx").exists() and not (tmp_path / "idx").exists()


def test_a_batch_where_the_lm_extractor_fell_back_is_done_again_by_the_next_build(tmp_path):
    from dspy.utils import DummyLM

    from pipeline.index.extract import LMExtractor
    from tests.test_lm_extract import GOOD, PASSAGES

    docs = tmp_path / "docs"
    docs.mkdir()
    for number, passage in enumerate(PASSAGES):
        (docs / f"{number}.txt").write_text(f"{passage.title}\n\n{passage.text}")
    config = folder_config(extractor="lm", batch_files=1)
    runtime = Runtime(config, embedder=HashEmbedder())
    good = {**GOOD, "Leah Adler was a restaurateur.": {"entities": ["Leah Adler"], "facts": ["Leah Adler was a restaurateur who died in 2017."]}}
    malformed = {**GOOD, "Leah Adler was a restaurateur.": {"entities": ["Leah Adler"], "facts": []}}

    def build(answers):
        lines, extractor = [], LMExtractor(DummyLM(answers), "dummy/test", tmp_path / "cache")
        index, _ = ingest_folder(docs, tmp_path / "idx", config, runtime, extractor, log=lines.append)
        return index, extractor, lines

    index, extractor, _ = build(malformed)
    assert extractor.report()["fallbacks"] == 1 and "Leah Adler was a restaurateur who died in 2017." not in index.fact_text
    index, extractor, lines = build(good)
    # the other two batches are kept; Leah Adler's passage is asked again, and the LM's facts replace the fallback's
    assert "resuming: 2 of 3 batches were finished earlier" in lines[0]
    assert (extractor.report()["passages"], extractor.report()["extracted"]) == (1, 1) and "Leah Adler was a restaurateur who died in 2017." in index.fact_text


def test_the_rust_docs_bench_says_when_there_are_none_and_indexes_a_folder_it_is_given(tmp_path, capsys, monkeypatch):
    from experiments.bench import rust_docs

    monkeypatch.setattr(rust_docs, "rust_docs", lambda: None)  # no rustup, or no docs component
    assert rust_docs.main(["--out", str(tmp_path / "out")]) == 2
    assert "no Rust documentation here" in capsys.readouterr().err
    assert rust_docs.main(["--docs", str(tmp_path), "--under", "std", "--out", str(tmp_path / "out")]) == 2
    assert f"{tmp_path / 'std'}: not a folder" in capsys.readouterr().err
