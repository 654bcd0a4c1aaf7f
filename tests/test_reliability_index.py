"""What a user sees when an index: kills while writing, one writer, ids, checksums on load: each case ends in one line naming the problem
(exit 2) or in preserved state, never in a traceback, a lost folder or a silently wrong result."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from modules.errors import HyperProveError
from pipeline.runtime import Runtime
from tests.support import CORPUS, QUESTIONS, HashEmbedder, dead_pid, one_line, run, snapshot


def test_an_earlier_index_is_replaced_but_not_with_a_stranger_beside_it(files, capsys):
    out = files / "idx"
    assert run(capsys, "index", files / "corpus.json", "--out", out, "--embedder", "test-hash")[0] == 0
    assert run(capsys, "index", files / "corpus.json", "--out", out, "--embedder", "test-hash")[0] == 0  # an index replaces an index
    (out / "notes.txt").write_text("mine")
    code, _, err = run(capsys, "index", files / "corpus.json", "--out", out, "--embedder", "test-hash")
    assert code == 2 and "holds 'notes.txt', which is not part of a HyperProve index" in one_line(err)
    assert (out / "notes.txt").read_text() == "mine"


def test_index_refuses_its_out_before_the_build(files, capsys):
    class NoEmbedding(HashEmbedder):
        def encode(self, texts, progress=None):
            raise AssertionError("the build started")

    (files / "busy").mkdir()
    (files / "busy" / "data.csv").write_text("1,2")
    code, _, err = run(capsys, "index", files / "corpus.json", "--out", files / "busy", "--embedder", "test-hash",
                       runtime=lambda config: Runtime(config, embedder=NoEmbedding()))
    assert code == 2 and "holds 'data.csv'" in one_line(err)
    (files / "a-file").write_text("x")
    code, _, err = run(capsys, "index", files / "corpus.json", "--out", files / "a-file", "--embedder", "test-hash",
                       runtime=lambda config: Runtime(config, embedder=NoEmbedding()))
    assert code == 2 and one_line(err) == f"--out {files / 'a-file'}: is a file, not a folder for a HyperProve index"


def rewrite_manifest(index: Path, change, sign: bool = True) -> None:
    """Edit the manifest; `sign`: and recompute its own checksum, as a deliberate edit would."""
    from pipeline.index.store import manifest_checksum

    manifest = json.loads((index / "manifest.json").read_text())
    change(manifest)
    if sign:
        manifest["manifest_sha256"] = manifest_checksum(manifest)
    (index / "manifest.json").write_text(json.dumps(manifest))


def test_a_manifest_entry_without_its_keys_is_one_line(saved):
    from pipeline.index.store import load_index

    rewrite_manifest(saved, lambda manifest: manifest["files"]["facts.jsonl"].pop("sha256"))
    with pytest.raises(HyperProveError, match=r"manifest.json: the entry of 'facts.jsonl' needs its sha256 and bytes; the index is damaged"):
        load_index(saved)
    rewrite_manifest(saved, lambda manifest: manifest.pop("embedder"))
    with pytest.raises(HyperProveError, match=r"manifest.json: 'embedder' is missing or not a dict; the index is damaged"):
        load_index(saved)


def test_a_truncated_array_with_a_matching_checksum_is_one_line(saved):
    from pipeline.files import sha256_file
    from pipeline.index.store import load_index

    path = saved / "fact_vectors.npy"
    path.write_bytes(path.read_bytes()[:200])

    def resum(manifest):
        manifest["files"]["fact_vectors.npy"] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}

    rewrite_manifest(saved, resum)
    with pytest.raises(HyperProveError, match=r"idx: cannot be read \(ValueError: .*\); the index is damaged, rebuild it$"):
        load_index(saved)


@pytest.mark.parametrize("questions, message", [
    ([{**QUESTIONS[0], "question": "  "}], 'item 0: field "question" is empty'),
    ([QUESTIONS[0], QUESTIONS[0]], "items 0 and 1 have the same id 'q1'; ids name questions in results"),
    ([{**QUESTIONS[0], "decomposition": [{"question": "Who directed Jaws?", "answer": "x"}, {"question": "Who was the mother of #3?", "answer": "y"}]}],
     "item 0 decomposition[1]: \"#3\" refers to no earlier step ('Who was the mother of #3?')"),
])
def test_questions_that_cannot_be_scored_right_are_refused(files, questions, message):
    from experiments.data import load_questions
    from pipeline.index.corpus import load_corpus

    (files / "q.json").write_text(json.dumps(questions))
    with pytest.raises(HyperProveError) as error:
        load_questions(files / "q.json", load_corpus(files / "corpus.json"))
    assert str(error.value) == f"{files / 'q.json'}: {message}"


def test_the_same_passage_twice_is_refused(files):
    from pipeline.index.corpus import load_corpus

    (files / "twice.json").write_text(json.dumps([CORPUS[0], CORPUS[1], CORPUS[0]]))
    with pytest.raises(HyperProveError) as error:
        load_corpus(files / "twice.json")
    assert str(error.value) == f"{files / 'twice.json'}: items 0 and 2 are the same passage (title and text); keep one"


def test_an_index_caught_between_its_two_renames_is_put_back(saved, files):
    from pipeline.index.store import load_index

    before = snapshot(saved)
    os.replace(saved, files / f".idx.old-{dead_pid()}")  # killed after moving the old index aside
    index = load_index(saved)
    assert snapshot(saved) == before and index.counts()["passages"] == len(CORPUS)


def test_vectors_of_the_wrong_shape_are_still_caught(saved):
    from pipeline.files import atomic_save_npy, sha256_file
    from pipeline.index.store import load_index

    path = saved / "passage_vectors.npy"
    atomic_save_npy(path, np.zeros((2, 256), dtype=np.float32))
    rewrite_manifest(saved, lambda m: m["files"].update({"passage_vectors.npy": {"sha256": sha256_file(path), "bytes": path.stat().st_size}}))
    with pytest.raises(HyperProveError, match="passage vectors do not match the manifest counts"):
        load_index(saved)


def test_concurrent_writers_into_one_index_lose_nothing(files, capsys, monkeypatch):
    """Two `--add`s and a `--delete` at once (threads with their own lock descriptors, each slowed
    inside its change so that all three overlap): every batch and the deletion are in the index."""
    import threading
    import time

    from pipeline.config import HyperProveConfig
    from pipeline.index import commands as index_commands
    from pipeline.index.commands import add_to_index, delete_from_index
    from pipeline.index.store import load_index

    assert run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    grow, shrink = index_commands.grow_index, index_commands.shrink_index
    monkeypatch.setattr(index_commands, "grow_index", lambda *a, **k: (time.sleep(0.3), grow(*a, **k))[1])
    monkeypatch.setattr(index_commands, "shrink_index", lambda *a, **k: (time.sleep(0.3), shrink(*a, **k))[1])
    batches = {name: [{"title": f"{name} {k}", "text": f"{name} {k} is a place in Ohio."} for k in range(3)] for name in ("north", "south")}
    for name, batch in batches.items():
        (files / f"{name}.json").write_text(json.dumps(batch))
    (files / "gone.json").write_text(json.dumps(["Cincinnati"]))
    config = HyperProveConfig().with_overrides(index={"embedder": "test-hash"})
    runtime = Runtime(config, embedder=HashEmbedder())
    lines, errors = [], []

    def write(change):
        try:
            change()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    writers = [threading.Thread(target=write, args=(lambda n=name: add_to_index(files / f"{n}.json", files / "idx", config, runtime, lines.append),))
               for name in batches]
    writers.append(threading.Thread(target=write, args=(lambda: delete_from_index(files / "gone.json", files / "idx", config, runtime, lines.append),)))
    for writer in writers:
        writer.start()
        time.sleep(0.05)
    for writer in writers:
        writer.join()
    assert not errors
    index = load_index(files / "idx")
    titles = {p.title for p in index.passages}
    assert titles == {p["title"] for p in CORPUS if p["title"] != "Cincinnati"} | {p["title"] for b in batches.values() for p in b}
    assert index.generation == 3 and sorted(index.passage_ids.tolist()) == [0, 1, 2, 4, 5, 6, 7, 8, 9, 10]
    assert sum("is writing it; waiting for it to finish" in line for line in lines) >= 2


def test_a_second_save_over_a_changed_index_is_refused(saved):
    from pipeline.index.store import load_index, save_index

    index = load_index(saved)
    save_index(load_index(saved), saved)  # another writer, not using the lock, got there first: still generation 0
    other = load_index(saved)
    other.info["generations"] = [*other.info["generations"], {"generation": 1}]
    save_index(other, saved)
    with pytest.raises(HyperProveError, match=r"changed by another writer \(generation 1, this change was made on generation 0\); nothing written"):
        save_index(index, saved, replaces=0)
    assert load_index(saved).generation == 1


def test_a_deleted_id_is_never_given_again(files, capsys):
    top = len(CORPUS) - 1
    (files / "gone.json").write_text(json.dumps([top]))
    (files / "new.json").write_text(json.dumps([{"title": "Dayton", "text": "Dayton is a city in Ohio."}]))
    assert run(capsys, "index", files / "corpus.json", "--out", files / "idx", "--embedder", "test-hash")[0] == 0
    for argv in (["--delete", files / "gone.json"], ["--add", files / "new.json"]):
        assert run(capsys, "index", *argv, "--into", files / "idx", "--embedder", "test-hash")[0] == 0
    code, out, _ = run(capsys, "index", "--delete", files / "gone.json", "--into", files / "idx", "--embedder", "test-hash")
    assert code == 0 and f"item 0 ({top}) was removed in generation 1: skipped" in out and "nothing to delete" in out
    rows = [json.loads(line) for line in (files / "idx" / "passages.jsonl").read_text().splitlines()]
    assert rows[-1] == {"id": top + 1, "title": "Dayton", "text": "Dayton is a city in Ohio."}
    assert json.loads((files / "idx" / "manifest.json").read_text())["next_passage_id"] == top + 2


def resum(index: Path, name: str):
    """Change the manifest's entry of file `name` to its present checksum (and sign the manifest)."""
    from pipeline.files import sha256_file

    path = index / name
    rewrite_manifest(index, lambda m: m["files"].update({name: {"sha256": sha256_file(path), "bytes": path.stat().st_size}}))


def test_a_hand_edited_manifest_is_refused(saved):
    from pipeline.index.store import load_index

    rewrite_manifest(saved, lambda m: m["counts"].update(passages=4), sign=False)
    with pytest.raises(HyperProveError, match=r"manifest.json: its fields do not match its manifest_sha256 \(edited by hand\?\); the index is damaged"):
        load_index(saved)


def test_another_corpus_checksum_in_the_manifest_is_refused(saved, files):
    from pipeline.index.build import corpus_checksum
    from pipeline.index.corpus import load_corpus
    from pipeline.index.store import load_index

    (files / "more.json").write_text(json.dumps(CORPUS + [{"title": "Dayton", "text": "Dayton is a city in Ohio."}]))
    rewrite_manifest(saved, lambda m: m.update(corpus_sha256=corpus_checksum(load_corpus(files / "more.json"))))
    with pytest.raises(HyperProveError, match=r"manifest.json: its corpus_sha256 is not the checksum of the passages in passages.jsonl"):
        load_index(saved)


@pytest.mark.parametrize("name, change, message", [
    ("fact_vectors.npy", lambda v: np.full_like(v, np.nan), r"fact vector 0 is not finite and of unit norm \(squared norm nan\)"),
    ("passage_vectors.npy", lambda v: (v * 100).astype(np.int8), r"passage vectors are int8 of shape \(5, 256\), not float32 of \(5, 256\)"),
    ("entity_vectors.npy", lambda v: v * 2, r"entity vector 0 is not finite and of unit norm \(squared norm 4.0"),
])
def test_vectors_that_are_not_unit_float32_are_refused(saved, name, change, message):
    from pipeline.files import atomic_save_npy
    from pipeline.index.store import load_index

    atomic_save_npy(saved / name, change(np.load(saved / name)))
    resum(saved, name)
    with pytest.raises(HyperProveError, match=message):
        load_index(saved)


@pytest.mark.parametrize("passage, message", [(999999, "facts.jsonl names passage 999999 is out of range"), (-1, "names passage -1 is out of range")])
def test_a_fact_of_no_passage_is_refused_at_load(saved, passage, message):
    from pipeline.index.store import load_index

    lines = (saved / "facts.jsonl").read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "passage": passage})
    (saved / "facts.jsonl").write_text("\n".join(lines) + "\n")
    resum(saved, "facts.jsonl")
    with pytest.raises(HyperProveError, match=message):
        load_index(saved)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(generations={"generation": 0}), "'generations' is missing or not a list"),
    (lambda m: m["extractor"].pop("name"), "the extractor entry needs its name"),
    (lambda m: m.update(built_on=[1, 2]), "'built_on' must map each vector set to a count"),
    (lambda m: m.update(generations=[{"added": 5}]), "'generations' must list objects, each with its generation number"),
])
def test_hand_edited_manifest_fields_are_one_line_on_add(saved, files, capsys, change, message):
    (files / "new.json").write_text(json.dumps([{"title": "Dayton", "text": "Dayton is a city in Ohio."}]))
    rewrite_manifest(saved, change)
    code, _, err = run(capsys, "index", "--add", files / "new.json", "--into", saved, "--embedder", "test-hash")
    assert code == 2 and one_line(err) == f"{saved / 'manifest.json'}: {message}; the index is damaged, rebuild it"


def test_naming_entities_in_a_long_capitalised_query_is_linear(saved, monkeypatch):
    """Every span of a 1,000-word capitalised run was normalised (cubic: 133 s); now at most the
    longest name's words and two more from each word."""
    from pipeline.index import build as index_module
    from pipeline.index.store import load_index

    index = load_index(saved)
    calls = []
    normalise = index_module.normalise_entity
    monkeypatch.setattr(index_module, "normalise_entity", lambda text: (calls.append(text), normalise(text))[1])
    for words in (500, 1000):
        calls.clear()
        assert index.name_entities(" ".join(["Steven Spielberg"] + [f"Name{k}" for k in range(words)])) == [index.entity_ids["steven spielberg"]]
        assert len(calls) <= (words + 2) * (index.longest_name + 2)
    assert index.longest_name == 2


def test_what_a_load_killed_while_writing_derived_left_neither_blocks_a_rebuild_nor_is_read(saved, files, capsys):
    from pipeline.index.store import load_index

    shutil.rmtree(saved / "derived")
    scratch = saved / f".derived.tmp-{dead_pid()}"
    scratch.mkdir()
    (scratch / "fact_text.txt").write_text("half")
    assert load_index(saved).counts()["passages"] == len(CORPUS) and (saved / "derived" / "record.json").exists() and not scratch.exists()
    scratch.mkdir()
    assert run(capsys, "index", files / "corpus.json", "--out", saved, "--embedder", "test-hash")[0] == 0
